"""No lock held across a stall: a maintenance transaction another process keeps open (a
frozen worker's) costs the other sweepers at most its bound, and the frozen one, resumed,
changes nothing it no longer owns.

One connection of the test holds a backlog guard's row, or a relay is held inside its
transaction (its `before_mark`, after it published and before it marks), while another
run goes on. Every held lock is released by a timer after `HELD_AT_MOST_S`: were a run to
wait for it, the test would see the wait instead of hanging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from opledger.ledger import Ambiguous, Ledger
from opledger.ledger.bounds import MIN_BOUND, Bounds
from tests.intents import age, prepare

T = TypeVar("T")

#: the cycle of these runs: each transaction may sit idle 2 s, and wait for a lock 1 s
INTERVAL = timedelta(seconds=2)
#: the relay's wait (for a lost message, and for a queue to have been shallow)
AFTER = timedelta(seconds=0.3)
#: how long a test holds a lock at most (a run that waited for it would take this long)
HELD_AT_MOST_S = 6.0
#: a run that skips what is held instead of waiting for it is back well within this
PROMPT_S = 0.5


def _lost(ledger: Ledger, key: str) -> str:
    """A prepared operation whose message the relay takes for lost."""
    op_id = prepare(ledger, key)
    age(ledger, op_id, 120)
    return op_id


def _due(ledger: Ledger, key: str) -> str:
    """An unknown operation whose check is due."""
    op_id = prepare(ledger, key)
    claim = ledger.claim(op_id, owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="lost"))
    age(ledger, op_id, 5, column="next_check_at")
    return op_id


def _column(ledger: Ledger, op_id: str, column: str) -> object:
    with ledger.engine.connect() as conn:
        return conn.execute(
            text(f"SELECT {column} FROM operations WHERE id = :id"), {"id": op_id}
        ).scalar_one()


def _shallow(ledger: Ledger) -> None:
    """A first run of each guard, on an empty queue: the relay publishes from `AFTER` on
    (a message queued behind a backlog had that long to arrive)."""
    ledger.hand_out_checks(backoff=timedelta(seconds=30), depth=10**6, interval=INTERVAL)
    assert _relay(ledger, []) == []
    time.sleep(AFTER.total_seconds() + 0.05)


def _relay(ledger: Ledger, published: list[tuple[str, int]], **options: object) -> list[str]:
    return ledger.relay(
        older_than=AFTER,
        publish=lambda op_id, gen: published.append((op_id, gen)),
        depth=0,
        interval=INTERVAL,
        **options,  # type: ignore[arg-type]
    )


def _hand_out(ledger: Ledger) -> list[str]:
    handouts = ledger.hand_out_checks(backoff=timedelta(seconds=30), depth=0, interval=INTERVAL)
    return [h.op_id for h in handouts]


@contextmanager
def _held(ledger: Ledger, statement: str, **params: object) -> Iterator[None]:
    """`statement` run in a transaction of the test's own, kept open for the block (at
    most `HELD_AT_MOST_S`: a timer ends its session then, so a run waiting for it ends
    too, late, instead of hanging the test)."""
    with ledger.engine.connect() as conn:
        pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        conn.execute(text(statement), params)
        timer = threading.Timer(HELD_AT_MOST_S, _terminate, (ledger, pid))
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with suppress(DBAPIError):
                conn.rollback()


def _terminate(ledger: Ledger, pid: int) -> None:
    with ledger.engine.connect() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})


def _timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    started = time.monotonic()
    result = fn(*args)
    return result, time.monotonic() - started


def test_the_bounds_derive_from_the_cycle_and_are_local_to_its_transaction(
    ledger: Ledger,
) -> None:
    assert Bounds.of(timedelta(seconds=15)) == Bounds(
        lock=timedelta(seconds=7.5), idle=timedelta(seconds=15)
    )
    assert Bounds.of(timedelta(seconds=0.1)) == Bounds(lock=MIN_BOUND / 2, idle=MIN_BOUND)
    seen: list[tuple[str, str]] = []

    def look(conn: Connection) -> None:
        row = conn.execute(
            text(
                "SELECT current_setting('lock_timeout'), "
                "current_setting('idle_in_transaction_session_timeout')"
            )
        ).one()
        seen.append((row[0], row[1]))

    ledger._cycle("a look", INTERVAL, look, None)
    assert seen == [("1s", "2s")]
    with ledger.engine.connect() as conn:  # the pool's connections keep the server's own
        assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"


def test_a_backlog_guard_another_run_holds_is_skipped_not_waited_for(
    ledger: Ledger, grant: str
) -> None:
    due = [_due(ledger, f"u{i}") for i in range(3)]
    lost = _lost(ledger, "lost")
    _shallow(ledger)  # the guards' rows exist from here on
    for queue in ("reconcile", "dispatch"):
        with _held(ledger, "SELECT 1 FROM queue_guards WHERE queue = :q FOR UPDATE", q=queue):
            handed, took = _timed(_hand_out, ledger)
            published: list[tuple[str, int]] = []
            relayed, took_relay = _timed(_relay, ledger, published)
            if queue == "reconcile":
                assert handed == [] and took < PROMPT_S, (handed, took)
                assert relayed == [lost] and published == [(lost, 1)]
            else:
                assert sorted(handed) == sorted(due)
                assert relayed == [] and published == [] and took_relay < PROMPT_S
    # released: the next cycle takes the guard again
    age(ledger, lost, 600, column="enqueued_at")
    published = []
    assert _relay(ledger, published) == [lost]


def test_a_run_held_inside_its_transaction_does_not_hold_up_the_others(
    ledger: Ledger, grant: str
) -> None:
    """A relay frozen after it published (its guard and its rows locked): another relay
    skips both, the sweep expires leases and hands out checks; nothing waits."""
    lost = _lost(ledger, "lost")
    due = _due(ledger, "due")
    expiring = prepare(ledger, "expiring")
    assert ledger.claim(expiring, owner="dead", lease=timedelta(milliseconds=1)) is not None
    _shallow(ledger)
    inside, leave = threading.Event(), threading.Event()

    def frozen() -> None:
        inside.set()
        leave.wait(HELD_AT_MOST_S)

    first: list[tuple[str, int]] = []
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_relay, ledger, first, before_mark=frozen)
        assert inside.wait(10)
        try:
            second: list[tuple[str, int]] = []
            relayed, took = _timed(_relay, ledger, second)
            assert relayed == [] and second == [] and took < PROMPT_S
            expired, took = _timed(ledger.expire_leases)
            assert expired == [expiring] and took < PROMPT_S
            handed, took = _timed(_hand_out, ledger)
            assert sorted(handed) == sorted([due, expiring]) and took < PROMPT_S
        finally:
            leave.set()
        assert held.result() == [lost]  # within its bound: its cycle, committed
    assert first == [(lost, 1)]
    assert _column(ledger, lost, "relay_gen") == 1


def test_an_idle_maintenance_transaction_is_ended_and_its_run_loses_the_cycle(
    ledger: Ledger, grant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay stalled past its bound inside its transaction: the database ends its
    session (its locks go), another relay takes the cycle, and the stalled one, resumed,
    writes nothing: no crash, no second mark."""
    lost = _lost(ledger, "lost")
    _shallow(ledger)
    bound = Bounds.of(INTERVAL).idle.total_seconds()
    inside, resume = threading.Event(), threading.Event()
    pids: list[int] = []

    def stalled() -> None:
        inside.set()
        resume.wait(HELD_AT_MOST_S)

    def backend_of_stalled() -> None:
        with ledger.engine.connect() as conn:
            pids.extend(
                conn.execute(
                    text(
                        "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' "
                        "AND datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ).scalars()
            )

    first: list[tuple[str, int]] = []
    with ThreadPoolExecutor(1) as pool, caplog.at_level(logging.WARNING, "opledger.ledger"):
        held = pool.submit(_relay, ledger, first, before_mark=stalled)
        assert inside.wait(10)
        started = time.monotonic()
        backend_of_stalled()
        assert len(pids) == 1, pids

        def ended() -> bool:
            with ledger.engine.connect() as conn:
                return not conn.execute(
                    text("SELECT 1 FROM pg_stat_activity WHERE pid = :pid"), {"pid": pids[0]}
                ).all()

        while not ended():
            assert time.monotonic() - started < bound + 3, "the idle session was not ended"
            time.sleep(0.05)
        assert time.monotonic() - started >= bound - 0.2  # not before its bound
        # its locks went with it: this relay is the cycle's, and marks the operation
        second: list[tuple[str, int]] = []
        assert _relay(ledger, second) == [lost]
        assert second == [(lost, 1)]
        resume.set()
        assert held.result() == []  # lost the cycle: no error raised
    assert first == [(lost, 1)]  # what it published before its stall
    assert _column(ledger, lost, "relay_gen") == 1  # marked once, by the second relay
    assert "the relay lost its cycle" in caplog.text
    assert "sat idle too long" in caplog.text


def test_a_lock_waited_for_past_the_bound_loses_the_cycle(
    ledger: Ledger, grant: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A table lock held elsewhere (a migration's, an operator's) is waited for at most
    half the bound: the sweep's statement gives up and the run loses the cycle."""
    expiring = prepare(ledger, "expiring")
    assert ledger.claim(expiring, owner="dead", lease=timedelta(milliseconds=1)) is not None
    lock = Bounds.of(INTERVAL).lock.total_seconds()
    with (
        caplog.at_level(logging.WARNING, "opledger.ledger"),
        _held(ledger, "LOCK TABLE operations IN ACCESS EXCLUSIVE MODE"),
    ):
        expired, took = _timed(lambda: ledger.expire_leases(interval=INTERVAL))
    assert expired == [] and lock - 0.1 <= took < lock + 1.5, took
    assert "the lease expiry lost its cycle" in caplog.text
    assert "waited for a lock too long" in caplog.text
    assert ledger.expire_leases(interval=INTERVAL) == [expiring]


def test_a_sweeps_switch_check_waits_for_the_epochs_lock_at_most_its_bound(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    assert ledger.check_switch(interval=INTERVAL) is not None  # nothing held: the epoch
    held = _held(ledger, "LOCK TABLE ledger_epochs IN SHARE ROW EXCLUSIVE MODE")
    with held, caplog.at_level(logging.WARNING, logger="opledger"):
        checked, took = _timed(lambda: ledger.check_switch(interval=INTERVAL))
    assert checked is None  # lost this cycle: the next sweep checks again
    assert "the switch check lost its cycle" in caplog.text
    lock = Bounds.of(INTERVAL).lock.total_seconds()
    assert lock - 0.1 <= took < HELD_AT_MOST_S - 1  # its bound, not the holder's time
    assert ledger.check_switch(interval=INTERVAL) is not None  # released: checked again
