"""A provider that hangs every call beside a healthy one under load, with a real worker, a
real broker and beat running: the healthy provider's operations all confirm while the
other hangs, and the operations waiting for the hanging one hold no worker process while
they wait.

Counted, not timed: the calls that reached the hanging provider (its slots, no more), the
tasks active in the worker once the healthy provider is done (the hung calls only), the
times each waiting operation was published and deferred (once: its horizon is the hung
calls' in-flight deadline, so the relay does not publish it again before then), and its
claims (none)."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import text

from opledger.dev.chaos.variants import provider_limits
from opledger.dev.hanging import hanging_server
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.ledger.contract import Limits
from opledger.tasks.app import app, dispatch

from .conftest import settled, worker_with
from .test_provider_pressure import LIMITED, applied_once, backlog

pytestmark = [pytest.mark.system]

HUNG_SLOTS = 2  #: the hanging provider's concurrency: its calls in flight at most
HEALTHY = Limits(concurrency=1, rate=1000, burst=50)  #: one slot: its operations take turns


def mails(ledger: Ledger, n: int) -> list[str]:
    """`n` emails over the HTTP email API (the hanging provider here), each published once."""
    ops = [
        ledger.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"hung-{i}",
            action="email.send.v1",
            target="owner@acme.test",
            payload={"to": "owner@acme.test", "subject": f"hung {i}", "text": "t"},
            authorization_ref="auth_acme",
        ).id
        for i in range(n)
    ]
    for op_id in ops:
        dispatch.delay(op_id)
    return ops


def active_tasks() -> list[str]:
    """The operation ids of the tasks the workers are executing now (Celery's inspect)."""
    found = app.control.inspect(timeout=2).active() or {}
    # beat's own tasks (the relay, the sweep) run too, with no operation id
    return [str(t["args"][0]) for tasks in found.values() for t in tasks if t.get("args")]


def test_a_hanging_provider_holds_no_worker_process_while_its_operations_wait(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    sandbox.configure(LIMITED.account, processing_s=0.02, **provider_limits(HEALTHY))
    limits = {
        "email": {"concurrency": HUNG_SLOTS},
        LIMITED.provider: HEALTHY.model_dump(include={"concurrency", "rate", "burst"}),
    }
    with hanging_server() as (port, accepted):
        env = {
            "OPLEDGER_EMAIL_URL": f"http://127.0.0.1:{port}",
            "OPLEDGER_PROVIDER_LIMITS": json.dumps(limits),
            # a hung call holds its slot (and its process) for the whole test: its
            # in-flight deadline is a minute away, its lease as long
            "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "30",
            "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "30",
            "OPLEDGER_LEASE_SECONDS": "90",
        }
        # four processes: two held by the hung calls, two for everything else
        with worker_with(running, concurrency=4, **env) as worker:
            hung = mails(sys_ledger, 20)  # first in the queue
            wait_until(lambda: len(accepted) >= HUNG_SLOTS, 20, "the hung calls")
            healthy = backlog(sys_ledger, 40, "healthy", action=LIMITED.action)
            statuses = settled(sys_ledger, healthy, timeout=20)
            assert set(statuses.values()) == {Status.CONFIRMED}
            applied_once(sandbox, sys_ledger, healthy)

            # the hanging provider still hangs: its slots' calls in flight, the rest waiting
            states = {op_id: sys_ledger.history(op_id) for op_id in hung}
            in_flight = [o for o, h in states.items() if h.operation.status is Status.DISPATCHING]
            waiting = [o for o, h in states.items() if h.operation.status is Status.PREPARED]
            assert len(in_flight) == HUNG_SLOTS and len(waiting) == len(hung) - HUNG_SLOTS
            assert len(accepted) == HUNG_SLOTS  # no call over its slots reached it
            # what the worker's processes are doing now: the hung calls, nothing else
            assert sorted(active_tasks()) == sorted(in_flight)
            deadline = min(a.deadline_at for o in in_flight for a in states[o].attempts)
            for op_id in waiting:
                history = states[op_id]
                assert not history.attempts and history.operation.fence == 0  # no claim
                # deferred until the first slot can free, not "again in 0.05 s"
                due = history.operation.next_check_at
                assert due is not None and due >= deadline - timedelta(seconds=0.1)
            with sys_ledger.engine.connect() as conn:
                published = conn.execute(
                    text("SELECT sum(relay_gen) FROM operations WHERE id = ANY(:ids)"),
                    {"ids": waiting},
                ).scalar_one()
            assert published == 0  # never published again by the relay while it waits
            # each waiting operation was handled by one task, once: its first message
            deferred = re.findall(r"(op_\w+) waits for email until", worker.output())
            assert sorted(deferred) == sorted(waiting)
