"""A RabbitMQ restart, made by deleting the stack's virtual host and adding it again: every
queued message and every connection is lost, and until the permissions are back the broker
refuses connections (`NOT_ALLOWED`), as RabbitMQ does while it recovers a virtual host.

The beat must outlive the refusals (Celery's own scheduler exits on the first one), the
workers must reconnect and declare their queues again, and the relay must publish what the
broker lost: every operation confirmed once, none lost.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from typing import Any, SupportsIndex

import pytest
from celery import Celery

from opledger.dev.chaos.audit import audit
from opledger.dev.processes import PrivateVhost, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.beat import Scheduler
from tests.conftest import require_rabbitmq
from tests.intents import prepare

from .conftest import settled

pytestmark = [pytest.mark.system, pytest.mark.rabbitmq]


@pytest.mark.parametrize("broker", ["rabbitmq"])
def test_a_broker_restart_loses_messages_but_no_operation(
    broker: str,
    running: Stack,
    rabbit_vhost: PrivateVhost,
    sys_ledger: Ledger,
    sandbox: Sandbox,
) -> None:
    from opledger.tasks.app import dispatch

    first = prepare(sys_ledger, "before-the-restart")
    dispatch.delay(first)
    settled(sys_ledger, [first])

    worker = running.workers["w1"]
    worker.signal(signal.SIGSTOP)  # a worker that cannot take the next message in time
    try:
        queued = prepare(sys_ledger, "queued-at-the-restart", target="case-319")
        dispatch.delay(queued)
        wait_until(lambda: _held(rabbit_vhost, "dispatch") == 1, 10, "the message to be held")

        rabbit_vhost.kill()  # the queue, its message and every connection: gone
        unpublished = prepare(sys_ledger, "prepared-while-down", target="case-320")
        with contextlib.suppress(Exception):  # the broker refuses: the relay's to publish
            dispatch.delay(unpublished)
        time.sleep(2.0)  # beat ticks every 0.5 s: each tick meets the refusing broker
    finally:  # the session's virtual host and worker stay usable whatever failed here
        if not rabbit_vhost.exists:
            rabbit_vhost.start()
        worker.signal(signal.SIGCONT)

    op_ids = [first, queued, unpublished]
    assert settled(sys_ledger, op_ids, timeout=60) == dict.fromkeys(op_ids, Status.CONFIRMED)
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean, result.problems
    assert sandbox.truth()["effects"] == dict.fromkeys(
        [f"crm:{sys_ledger.get(op_id).idempotency_key}" for op_id in op_ids], 1
    )
    assert running.beat is not None
    assert running.beat.proc.poll() is None, running.beat.output()[-3000:]
    assert worker.proc.poll() is None, worker.output()[-3000:]
    # the beat went on publishing after the restart: the relay published the lost ones
    assert "relay: re-published" in worker.output()


def _held(vhost: PrivateVhost, queue: str) -> int:
    """Messages `queue` holds, ready or delivered and not yet acknowledged."""
    counts = {name: int(n) for name, n in vhost.listed("list_queues", "name", "messages")}
    return counts.get(queue, 0)


def test_the_beat_scheduler_waits_out_a_broker_that_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Celery's scheduler raises on a refused connection and the beat process exits; ours
    logs it and connects once the broker lets it."""
    require_rabbitmq()
    vhost = PrivateVhost()  # not added yet: the broker answers NOT_ALLOWED
    app = Celery("refused", broker=vhost.url, set_as_current=False)
    app.conf.broker_connection_timeout = 3
    scheduler = Scheduler(app, lazy=True)
    result: dict[str, Any] = {}
    deadline = time.monotonic() + 60

    def bounded_sleep(seconds: float | SupportsIndex) -> None:  # the real wait, never past the test
        if time.monotonic() > deadline:
            raise TimeoutError("the scheduler was still retrying when the test gave up")
        time.sleep(seconds)

    scheduler.sleep = bounded_sleep

    def connect() -> None:
        try:
            result["connection"] = scheduler._ensure_connected()
        except BaseException as exc:  # reported by the assertions below
            result["error"] = exc

    caplog.set_level(logging.ERROR, logger="opledger.beat")
    thread = threading.Thread(target=connect, daemon=True)
    try:
        thread.start()
        wait_until(lambda: "refused" in caplog.text or not thread.is_alive(), 20, "a refusal")
        assert "error" not in result, result
        vhost.start()
        thread.join(timeout=40)
        assert not thread.is_alive(), "the scheduler never connected once the broker let it"
        assert "error" not in result, result
        assert result["connection"].connected
        assert "NotAllowed" in caplog.text
    finally:
        with contextlib.suppress(Exception):
            result.get("connection") and result["connection"].close()
        vhost.kill()
        app.close()
