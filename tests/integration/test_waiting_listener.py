"""Waiting that scales: every agent waiting in a process, in threads and in event loops,
shares one listening connection to the real Postgres, is woken by the settling commit's
NOTIFY, and keeps waiting correctly across a lost connection."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from sqlalchemy.engine import make_url

from opledger.agents import EffectCancelled, EffectConfirmed, Effects
from opledger.agents.listener import CHANNEL, listener_for
from opledger.ledger import Answer, Ledger, Status
from opledger.ledger import queries as q
from opledger.ledger.connector import ledger_engine
from tests.conftest import libpq
from tests.intents import prepare, settle


def listening_connections(database_url: str) -> int:
    """Backends of this database whose last statement was our LISTEN."""
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = %s",
            (f"LISTEN {CHANNEL}",),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def effects(ledger: Ledger, grant: str) -> Effects:
    return Effects(ledger, publish=lambda _op_id: None, poll=60.0)


def test_a_thousand_agents_wait_in_one_event_loop_on_one_connection(
    ledger: Ledger, effects: Effects, database_url: str
) -> None:
    ops = [prepare(ledger, f"many-{i}") for i in range(1000)]

    async def agents() -> list[object]:
        waiting = [asyncio.create_task(effects.await_result(op, timeout=60)) for op in ops]
        listener = listener_for(effects._dsn)
        while listener.waiting() < len(ops):  # every agent registered and reading
            await asyncio.sleep(0.05)
        assert listening_connections(database_url) == 1

        def settle_all() -> None:
            for op in ops:
                settle(ledger, op)

        await asyncio.to_thread(settle_all)
        return list(await asyncio.gather(*waiting))

    started = time.monotonic()
    results = asyncio.run(agents())
    assert all(isinstance(r, EffectConfirmed) for r in results)
    assert time.monotonic() - started < 50  # woken by NOTIFY, not by the 60 s poll


def test_agents_in_threads_share_it_too(
    ledger: Ledger, effects: Effects, database_url: str
) -> None:
    ops = [prepare(ledger, f"threads-{i}") for i in range(40)]
    with ThreadPoolExecutor(len(ops)) as pool:
        waiting = [pool.submit(effects.wait, op, 60) for op in ops]
        listener = listener_for(effects._dsn)
        deadline = time.monotonic() + 20
        while listener.waiting() < len(ops) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert listening_connections(database_url) == 1
        for op in ops:
            settle(ledger, op)
        results = [w.result(timeout=30) for w in waiting]
    assert {r.operation.status for r in results} == {Status.CONFIRMED}


def test_a_lost_listening_connection_is_replaced_and_nothing_is_missed(
    ledger: Ledger, effects: Effects, database_url: str
) -> None:
    first, second = prepare(ledger, "lost-1"), prepare(ledger, "lost-2")
    result: list[object] = []
    waiting = threading.Thread(target=lambda: result.append(effects.wait(first, 30)))
    waiting.start()
    listener = listener_for(effects._dsn)
    deadline = time.monotonic() + 10
    while listener.waiting() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    # the listening backend goes away (a restart, a pooler, an administrator)
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = %s",
            (f"LISTEN {CHANNEL}",),
        )
    settle(ledger, first)  # settled while nobody listens: the waiter reads it on reconnect
    waiting.join(timeout=20)
    assert not waiting.is_alive() and isinstance(result[0], EffectConfirmed)
    deadline = time.monotonic() + 10
    while not listener.listening and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.listening and listening_connections(database_url) == 1
    # and the new connection wakes the next waiter as the old one did
    later: list[object] = []
    waiting = threading.Thread(target=lambda: later.append(effects.wait(second, 30)))
    waiting.start()
    while listener.waiting() < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    settle(ledger, second)
    waiting.join(timeout=20)
    assert isinstance(later[0], EffectConfirmed)
    assert time.monotonic() - started < 10  # woken by NOTIFY, not by the 60 s poll


def test_woken_agents_are_answered_a_batch_at_a_time_on_two_connections(
    ledger: Ledger, grant: str, database_url: str
) -> None:
    """300 agents in one event loop, on a ledger whose pool holds one connection: the
    listener reads the answers of every waiter a batch of notifications woke in one
    statement, so no woken agent reads for itself, and waiting holds three connections at
    most: the listening one, the one the listener reads on, and the pool's one (the
    agents' first reads)."""
    name = "opledger-waiters-test"
    url = make_url(database_url).update_query_dict({"application_name": name})
    engine = ledger_engine(
        url.render_as_string(hide_password=False),
        schema=ledger.schema,
        pool_size=1,
        max_overflow=0,
    )
    narrow = Ledger(engine, schema=ledger.schema)
    listener_reads: list[int] = []
    own_reads: list[int] = []
    answers, answer = narrow.answers, narrow.answer

    def counted(op_ids: Iterable[str]) -> dict[str, Answer]:
        ids = list(op_ids)
        assert threading.current_thread().name == "opledger-settle-listener"
        listener_reads.append(len(ids))
        return answers(ids)

    def counted_one(op_id: str) -> Answer:
        own_reads.append(1)
        return answer(op_id)

    narrow.answers = counted  # type: ignore[method-assign]
    narrow.answer = counted_one  # type: ignore[method-assign]
    effects = Effects(narrow, publish=lambda _op_id: None, poll=60.0)
    ops = [prepare(ledger, f"batch-{i}") for i in range(300)]
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            while not stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (name,),
                ).fetchone()
                assert row is not None
                peak[0] = max(peak[0], int(row[0]))
                stop.wait(0.02)

    async def agents() -> list[object]:
        waiting = [asyncio.create_task(effects.await_result(op, timeout=60)) for op in ops]
        listener = listener_for(effects._dsn)
        while listener.waiting() < len(ops) or len(own_reads) < len(ops):
            await asyncio.sleep(0.05)

        def cancel_all() -> None:  # one transaction: every NOTIFY arrives at its commit
            with ledger.engine.begin() as conn:
                for op in ops:
                    conn.execute(q.CANCEL, {"op_id": op, "actor": "test", "reason": "batch"})

        await asyncio.to_thread(cancel_all)
        return list(await asyncio.gather(*waiting))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        results = asyncio.run(agents())
    finally:
        stop.set()
        sampler.join()
        engine.dispose()
    assert all(isinstance(r, EffectCancelled) for r in results)
    assert len(own_reads) == len(ops)  # each agent's first read, none after its wake
    assert sum(listener_reads) == len(ops) and len(listener_reads) <= 10, listener_reads
    assert 1 <= peak[0] <= 3, peak[0]


def test_without_a_listening_connection_the_dispatch_goes_out_at_once_and_polls_answer(
    ledger: Ledger, grant: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that cannot LISTEN (a pooler in transaction mode): the agent's dispatch is
    published as soon as its waiter is registered, not after the wait for the connection,
    and the agent learns the settle by reading (it may have come before anyone listened)."""
    from opledger.agents import listener as listening

    name = "opledger-never-listens-test"
    url = make_url(database_url).update_query_dict({"application_name": name})
    engine = ledger_engine(url.render_as_string(hide_password=False), schema=ledger.schema)
    unheard = Ledger(engine, schema=ledger.schema, actions=ledger.actions)
    monkeypatch.setattr(listening, "CONNECT_WAIT", 1.0)
    monkeypatch.setattr(
        listening.Listener, "_run", lambda self: self._stopped.wait()
    )  # never connects
    published: list[float] = []
    started = time.monotonic()

    def publish(op_id: str) -> None:
        published.append(time.monotonic() - started)
        settle(ledger, op_id)  # a fast worker: settled before anyone could listen

    effects = Effects(unheard, publish=publish, poll=60.0)
    try:
        result = effects.effect(
            tenant="acme",
            run="never-listens",
            action="crm.close_case.v1",
            target="case-1",
            payload={"note": "x"},
            authorization_ref=grant,
            intent_key="close",
            wait=10,
        )
    finally:
        listener_for(effects._dsn).stop()
        engine.dispose()
    assert published and published[0] < 0.5, published  # before the 1 s wait for LISTEN
    assert isinstance(result, EffectConfirmed)  # read, not waited for
    assert time.monotonic() - started < 5  # not the 60 s poll
