"""A worker frozen (SIGSTOP: a paused VM, a long GC) in the middle of a maintenance
transaction holds nothing past its bound: the other worker keeps sweeping, relaying and
confirming, and the frozen one, resumed, changes nothing it no longer owns.

The freeze is timed by the database: the test locks `queue_guards` (SHARE) so that the
next run to save a backlog guard waits, inside its transaction, its guard's row already
locked; the worker whose backend waits there (found by its client port) is stopped whole
(SIGSTOP to its process group), and the test's lock released: its backend finishes the
statement and sits idle in the transaction, holding the guard (and, for the relay, the
rows it published and marked), as a worker frozen there would. In turn: a sweep's hand-out
of due checks (the reconcile queue's guard), then a relay (the dispatch queue's).
"""

from __future__ import annotations

import signal
import time
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Any

import psutil
import pytest
from sqlalchemy import text

from opledger.dev.processes import Proc, Stack, wait_until
from opledger.ledger import Ledger, Status
from opledger.ledger.bounds import Bounds
from opledger.tasks.app import dispatch
from tests.intents import prepare

from .conftest import settings_of, settled, worker_with

pytestmark = pytest.mark.system

#: a run waiting to save its guard (this statement, and the one table lock it waits for)
WAITING = text(
    """
    SELECT a.pid, a.client_port,
           EXISTS (SELECT 1 FROM pg_locks AS l
                   WHERE l.pid = a.pid AND l.granted
                     AND l.relation = to_regclass('attempts')) AS relay
    FROM pg_stat_activity AS a
    WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'
      AND a.query LIKE '%UPDATE queue_guards%'
    """
)


def _owner(workers: list[Proc], port: int) -> Proc | None:
    """The worker one of whose processes holds the client end of `port`."""
    for worker in workers:
        with suppress(psutil.Error):
            root = psutil.Process(worker.proc.pid)
            for process in [root, *root.children(recursive=True)]:
                if any(c.laddr and c.laddr.port == port for c in process.net_connections("tcp")):
                    return worker
    return None


def _freeze(ledger: Ledger, workers: list[Proc], relay: bool) -> tuple[Proc, int]:
    """Stop the worker whose sweep (or relay: `relay`) is the first found saving its guard,
    inside its transaction; that worker and its backend's pid."""
    deadline = time.monotonic() + 20
    # pg_stat_activity is read afresh by each statement only outside a transaction
    auto = ledger.engine.execution_options(isolation_level="AUTOCOMMIT")
    with ledger.engine.connect() as held, auto.connect() as look:
        while time.monotonic() < deadline:
            held.execute(text("LOCK TABLE queue_guards IN SHARE MODE"))
            # a run saving its guard waits for it, at most its lock bound (0.5 s)
            until = time.monotonic() + 2
            while time.monotonic() < until:
                for pid, port, is_relay in look.execute(WAITING).all():
                    worker = _owner(workers, port) if is_relay == relay else None
                    if worker is not None:
                        worker.signal(signal.SIGSTOP)
                        held.rollback()  # its backend finishes the statement, then idles
                        return worker, pid
                time.sleep(0.01)
            held.rollback()
    raise AssertionError(f"no {'relay' if relay else 'sweep'} was found saving its guard")


def _guard(ledger: Ledger, queue: str) -> datetime | None:
    with ledger.engine.connect() as conn:
        sampled: datetime | None = conn.execute(
            text("SELECT sampled_at FROM queue_guards WHERE queue = :q"), {"q": queue}
        ).scalar_one_or_none()
        return sampled


def _alive(ledger: Ledger, pid: int) -> bool:
    with ledger.engine.connect() as conn:
        return bool(
            conn.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).all()
        )


def _facts(ledger: Ledger, op_ids: list[str]) -> list[Any]:
    """What each operation's record says: status, fence, generations, transitions."""
    facts = []
    for op_id in op_ids:
        h = ledger.history(op_id)
        with ledger.engine.connect() as conn:
            gens = conn.execute(
                text("SELECT relay_gen, check_gen, enqueued_at FROM operations WHERE id = :id"),
                {"id": op_id},
            ).one()
        facts.append((h.operation.status, h.operation.fence, tuple(gens), len(h.transitions)))
    return facts


@pytest.mark.parametrize("frozen_in", ["sweep", "relay"])
def test_a_worker_frozen_inside_a_maintenance_transaction_costs_the_others_one_bound(
    running: Stack, sys_ledger: Ledger, frozen_in: str
) -> None:
    settings = settings_of(running.env)
    interval = settings.sweep_interval_seconds
    idle = Bounds.of(timedelta(seconds=interval)).idle.total_seconds()
    relay = frozen_in == "relay"
    queue = "dispatch" if relay else "reconcile"
    with worker_with(running, "a") as a:
        b = running.start_worker("b")
        warm = prepare(sys_ledger, f"warm-{frozen_in}")
        dispatch.delay(warm)
        settled(sys_ledger, [warm])
        frozen, backend = _freeze(sys_ledger, [a, b], relay)
        other = b if frozen is a else a
        frozen_at = time.monotonic()
        try:
            before = _guard(sys_ledger, queue)
            # work for the other worker: one sent now, one whose message was lost (only
            # the relay publishes it), one whose worker died holding its lease (the sweep
            # fences it out and hands its check out)
            sent = prepare(sys_ledger, f"sent-{frozen_in}")
            lost = prepare(sys_ledger, f"lost-{frozen_in}")
            dead = prepare(sys_ledger, f"dead-{frozen_in}")
            assert sys_ledger.claim(dead, owner="dead", lease=timedelta(milliseconds=1)) is not None
            dispatch.delay(sent)
            # the database ends the frozen transaction at its bound, not before
            wait_until(
                lambda: not _alive(sys_ledger, backend), idle + 2, "the frozen session to end"
            )
            ended = time.monotonic() - frozen_at
            assert ended >= idle - 0.3, ended
            # the other worker's guarded runs take the guard again within a cycle of that
            wait_until(
                lambda: (_guard(sys_ledger, queue) or before) != before,
                2 * interval + 2,
                f"the other worker to sample the {queue} guard",
            )
            mine = [warm, sent, lost, dead]
            statuses = settled(sys_ledger, mine, timeout=settings.relay_after_seconds + 10)
            assert statuses == dict.fromkeys(mine, Status.CONFIRMED)
            assert "lease expired" in [t.reason for t in sys_ledger.history(dead).transitions]
            facts = _facts(sys_ledger, mine)
            sampled = _guard(sys_ledger, queue)
            assert sampled is not None
            output = len(frozen.output())
        finally:
            frozen.signal(signal.SIGCONT)
        # resumed: its transaction is gone, its run lost the cycle; it writes nothing
        wait_until(
            lambda: "lost its cycle" in frozen.output()[output:],
            10,
            "the resumed worker to say it lost its cycle",
        )
        time.sleep(2 * interval)
        assert _facts(sys_ledger, mine) == facts
        after = _guard(sys_ledger, queue)
        assert after is not None and after >= sampled  # never back to the frozen run's
        assert "Traceback" not in frozen.output()[output:]
        assert frozen.proc.poll() is None and other.proc.poll() is None
