"""The worker's two statements run on connections kept for them (`Store.hot`): a broken
connection is a `DatabaseUnavailable` and is replaced, a forked child never touches its
parent's, and `engine.dispose()` closes them."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine

from opledger.ledger import Binding, Confirmed, DatabaseUnavailable, Ledger, Status
from opledger.ledger.migrate import sqlalchemy_url
from tests.conftest import libpq
from tests.intents import intent, prepare

APP = "opledger-hot-path-test"  #: our own ledger's connections, told apart from the suite's


def _confirm(ledger: Ledger, op_id: str) -> Status:
    claim = ledger.claim(op_id, owner="w")
    assert claim is not None
    op = ledger.record_outcome(
        claim,
        Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key)),
    )
    return op.status


@pytest.fixture
def own_ledger(database_url: str, ledger: Ledger) -> Iterator[Ledger]:
    """A ledger with its own connections, so killing them leaves the shared one alone."""
    engine = create_engine(
        sqlalchemy_url(database_url), pool_size=1, connect_args={"application_name": APP}
    )
    mine = Ledger(engine)
    yield mine
    mine.engine.dispose()


def _hot_backends(database_url: str, expect: int | None = None) -> list[int]:
    """The backends whose last statement was the outcome; with `expect`, waits (up to 5 s)
    for that many, since a closed connection's backend exits a moment later."""
    deadline = time.monotonic() + 5
    while True:
        with psycopg.connect(libpq(database_url), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s AND query LIKE '%%SET finished_at = now(), outcome%%'",
                (APP,),
            ).fetchall()
        if expect is None or len(rows) == expect or time.monotonic() > deadline:
            return [pid for (pid,) in rows]
        time.sleep(0.05)


def test_a_broken_connection_is_unavailable_then_replaced(
    own_ledger: Ledger, database_url: str, grant: str
) -> None:
    first, op_id = prepare(own_ledger, "first"), prepare(own_ledger, "second")
    assert _confirm(own_ledger, first) is Status.CONFIRMED
    pids = _hot_backends(database_url, expect=1)
    assert len(pids) == 1, "one connection ran every statement"
    with psycopg.connect(libpq(database_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
    with pytest.raises(DatabaseUnavailable):
        own_ledger.claim(op_id, owner="w")
    # the broken connection was closed, not given back: the next call opens a new one
    assert _confirm(own_ledger, op_id) is Status.CONFIRMED
    assert _hot_backends(database_url) not in ([], pids)


def test_a_prepare_that_finds_its_connection_broken_takes_the_full_path(
    own_ledger: Ledger, database_url: str, grant: str
) -> None:
    """An intent's one-statement insert on a broken kept connection (a restarted server)
    is not an error for the caller: the full path records it (or finds it recorded)."""
    assert _confirm(own_ledger, prepare(own_ledger, "first")) is Status.CONFIRMED
    [pid] = _hot_backends(database_url, expect=1)  # the kept connection, idle
    with psycopg.connect(libpq(database_url), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    op = own_ledger.prepare(**intent("second"))
    assert own_ledger.get(op.id).status is Status.PREPARED
    assert own_ledger.payload(op.id) is not None
    assert _confirm(own_ledger, op.id) is Status.CONFIRMED


def test_a_forked_child_never_uses_its_parents_connection(
    own_ledger: Ledger, database_url: str, grant: str
) -> None:
    assert _confirm(own_ledger, prepare(own_ledger, "parent")) is Status.CONFIRMED
    child_op = prepare(own_ledger, "child")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as a Celery pool process does (tasks.app._after_fork)
        code = 1
        try:
            own_ledger.dispose()
            code = 0 if _confirm(own_ledger, child_op) is Status.CONFIRMED else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"\x00"
    os.close(read)
    # the parent's own connection still works: the child neither used nor closed it
    assert _confirm(own_ledger, prepare(own_ledger, "parent-again")) is Status.CONFIRMED


def test_disposing_the_engine_closes_them(
    own_ledger: Ledger, database_url: str, grant: str
) -> None:
    assert _confirm(own_ledger, prepare(own_ledger, "once")) is Status.CONFIRMED
    assert len(_hot_backends(database_url, expect=1)) == 1
    own_ledger.engine.dispose()
    assert _hot_backends(database_url, expect=0) == []


def test_errors_are_translated_as_on_every_other_path(own_ledger: Ledger) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import DataError

    from opledger.ledger import SchemaMissing

    store = own_ledger._store
    with pytest.raises(SchemaMissing, match="opledger migrate"):
        store.hot(text("SELECT * FROM no_such_table"), {})
    with pytest.raises(DataError):  # none of the ledger's: SQLAlchemy's kind, as elsewhere
        store.hot(text("SELECT 1 / CAST(:zero AS int)"), {"zero": 0})
    # the connection survived both and is used again
    assert store.hot(text("SELECT CAST(:one AS int)"), {"one": 1}) == (1,)


def test_a_ledger_dropped_without_dispose_lets_go_of_its_connections(
    database_url: str, grant: str
) -> None:
    """Nothing keeps the connections alive but the ledger: a test or a script that drops
    its ledger does not leak one connection per ledger until the server runs out."""
    import gc

    for n in range(3):
        engine = create_engine(
            sqlalchemy_url(database_url), pool_size=1, connect_args={"application_name": APP}
        )
        dropped = Ledger(engine)
        assert _confirm(dropped, prepare(dropped, f"dropped-{n}")) is Status.CONFIRMED
        del dropped, engine
    gc.collect()
    assert _hot_backends(database_url, expect=0) == []


def test_a_ledger_collected_while_its_engine_is_disposed_fails_nothing(
    database_url: str, grant: str
) -> None:
    """`engine.dispose()` drops every ledger's hot connections through one listener of the
    engine's, so a ledger collected while the engine calls its listeners removes nothing
    from under it (a listener per ledger, removed by its finalizer, once failed a dispose
    with "deque mutated during iteration")."""
    import gc

    from sqlalchemy import event

    engine = create_engine(
        sqlalchemy_url(database_url), pool_size=1, connect_args={"application_name": APP}
    )
    kept = Ledger(engine)
    assert _confirm(kept, prepare(kept, "kept")) is Status.CONFIRMED
    gc.disable()
    try:
        for n in range(5):  # ledgers dropped on the same engine, freed only by a collection
            dropped: Any = Ledger(engine)
            assert _confirm(dropped, prepare(dropped, f"dropped-{n}")) is Status.CONFIRMED
            dropped.cycle = dropped
            del dropped
        # a collection while the engine calls its dispose listeners
        event.listen(engine, "engine_disposed", lambda _engine: gc.collect(), insert=True)
        engine.dispose()
    finally:
        gc.enable()
    assert len(engine.dispatch.engine_disposed) == 2  # ours, and the ledgers' one
    assert _hot_backends(database_url, expect=0) == []
