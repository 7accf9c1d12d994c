"""opledger on RabbitMQ quorum queues (`OPLEDGER_RABBITMQ_QUEUE_TYPE=quorum`).

Quorum queues have no global prefetch and hold no delayed message: Celery detects them,
sets the prefetch per consumer, and sends a countdown through its native delayed delivery
(a ladder of topic exchanges and TTL queues the worker declares), which routes only
through topic exchanges. A virtual host of this module's own (a queue's type cannot
change once declared), a worker killed after the provider answered, and a countdown.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery

from opledger import celeryconfig
from opledger.dev.chaos.audit import audit
from opledger.dev.processes import PrivateVhost, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.queues import QUEUES, queues_of
from tests.conftest import require_rabbitmq
from tests.forks import ForkedProc
from tests.intents import prepare

from .conftest import crashes, settled

pytestmark = [pytest.mark.system, pytest.mark.rabbitmq]


@pytest.fixture(scope="module")
def quorum_stack(
    database_url: str, stack: Stack, sandbox_server: Sandbox, workdir: Path
) -> Iterator[tuple[Stack, PrivateVhost]]:
    from opledger.dev.chaos.run import stack_env

    require_rabbitmq()
    stack.stop_all()  # one stack at a time: the Redis one's beat would sweep these ops
    vhost = PrivateVhost()
    vhost.start()
    env = stack_env(database_url, vhost.url, sandbox_server, workdir)
    env["OPLEDGER_RABBITMQ_QUEUE_TYPE"] = "quorum"
    quorum = Stack(env, workdir, name="quorum", proc=ForkedProc)
    try:
        yield quorum, vhost
    finally:
        quorum.stop_all()
        vhost.kill()


def _queue_types(vhost: PrivateVhost) -> dict[str, str]:
    return {name: kind for name, kind in vhost.listed("list_queues", "name", "type")}


def test_a_crash_window_and_a_countdown_on_quorum_queues(
    quorum_stack: tuple[Stack, PrivateVhost],
    sys_ledger: Ledger,
    sandbox: Sandbox,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stack, vhost = quorum_stack
    crashy = stack.start_worker(
        "crashy", concurrency=1, OPLEDGER_CRASHPOINT="dispatch.after_call:1"
    )
    types = _queue_types(vhost)
    assert {q: types.get(q) for q in QUEUES} == dict.fromkeys(QUEUES, "quorum"), types
    stack.start_beat()

    # Published by the relay (from the worker, on its quorum configuration); the worker's
    # pool process is killed after the provider applied it, before the outcome is saved.
    relayed = prepare(sys_ledger, "quorum-relayed")
    wait_until(lambda: crashes(crashy) >= 1, 30, "the crash after the call")

    # Published with a countdown by a publisher of its own (the test process's app keeps
    # classic queues): it must come through native delayed delivery, not at once.
    publisher = Celery("publisher", broker=vhost.url, set_as_current=False)
    publisher.conf.update(
        task_queues=queues_of("quorum", vhost.url),
        task_routes=celeryconfig.task_routes,
        task_serializer="json",
    )
    delayed = prepare(sys_ledger, "quorum-delayed", target="case-319")
    sent_at = datetime.now(UTC)
    try:
        with caplog.at_level(logging.WARNING, logger="celery"):
            publisher.send_task("opledger.dispatch", args=[delayed], countdown=3)
    finally:
        publisher.close()
    # sent into Celery's native delayed delivery (the worker declared its exchanges), not
    # held in a worker until its ETA, as it would be behind a direct exchange
    assert "Direct exchanges are not supported" not in caplog.text
    assert ["celery_delayed_27"] in vhost.listed("list_exchanges", "name")

    stack.kill_worker("crashy")
    stack.start_worker("w1")
    op_ids = [relayed, delayed]
    assert settled(sys_ledger, op_ids, timeout=60) == dict.fromkeys(op_ids, Status.CONFIRMED)
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean, result.problems
    assert sandbox.truth()["effects"] == dict.fromkeys(
        [f"crm:{sys_ledger.get(op_id).idempotency_key}" for op_id in op_ids], 1
    )
    first = sys_ledger.history(delayed).attempts[0]
    # Celery's native delayed delivery counts whole seconds: it recomputes the countdown
    # from the ETA a moment later and floors it (2.99 s -> 2 s), so "not before 2 s" is
    # what a 3 s countdown promises here (not held at all would be a fraction of a second)
    assert first.started_at >= sent_at + timedelta(seconds=2), (sent_at, first.started_at)
