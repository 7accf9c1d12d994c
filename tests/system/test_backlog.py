"""At most one outstanding message per operation, with real workers and a real Redis."""

from __future__ import annotations

import time

import pytest

from opledger.dev.processes import PrivateRedis, PrivateVhost, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch
from opledger.tasks.backlog import SENT_HEADER, Generations, queue_depth
from tests.intents import key_of, prepare

from .conftest import settled

pytestmark = pytest.mark.system


def test_a_superseded_duplicate_is_dropped_unread_and_the_newer_one_moves_it(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox, private_redis: PrivateRedis
) -> None:
    op_id = prepare(sys_ledger, "superseded")
    Generations(private_redis.url, ttl_s=60).published("dispatch", [(op_id, 2)])
    worker = running.workers["w1"]
    # An hour-old message of generation 1: a newer one (2) was published since.
    dispatch.apply_async((op_id,), {"gen": 1}, headers={SENT_HEADER: time.time() - 3600})
    wait_until(
        lambda: f"dispatch of {op_id}: generation 1 superseded" in worker.output(),
        15,
        "the worker to drop the superseded message",
    )
    assert sys_ledger.history(op_id).attempts == ()  # dropped without claiming
    # A fresh message (or the relay's next one) is never dropped: it moves the operation.
    dispatch.apply_async((op_id,), {"gen": 1})
    assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
    assert sandbox.effects(f"crm:{key_of(sys_ledger, op_id)}") == 1


def test_queue_depth_is_read_through_kombu(running: Stack, private_redis: PrivateRedis) -> None:
    from opledger.tasks.app import app

    assert queue_depth(app, "no-such-queue") == 0
    assert queue_depth(app, "dispatch") == private_redis.queued("dispatch")


@pytest.mark.rabbitmq
def test_on_rabbitmq_depth_comes_from_a_passive_declare_and_generations_drop_nothing(
    rabbit_vhost: PrivateVhost,
) -> None:
    """No worker: publish into the session's private vhost and read the depth back."""
    from celery import Celery

    from opledger import celeryconfig

    app = Celery("depth-probe", broker=rabbit_vhost.url, set_as_current=False)
    app.conf.task_queues = celeryconfig.task_queues
    app.conf.task_routes = celeryconfig.task_routes
    try:
        assert queue_depth(app, "no-such-queue") == 0  # RabbitMQ's 404, not an error
        for i in range(3):
            app.send_task("opledger.dispatch", (f"op_probe{i}",), {"gen": 0})
        # publishes are asynchronous (no confirms): the queue counts them a moment later
        wait_until(lambda: queue_depth(app, "dispatch") == 3, 10, "three messages queued")
        assert rabbit_vhost.queued("dispatch") == 3
        assert queue_depth(app, "reconcile") == 0
        # Generations live in Redis only: on RabbitMQ nothing is recorded, nothing dropped
        # (a superseded duplicate costs one refused claim instead; see docs/celery.md).
        generations = Generations(rabbit_vhost.url, ttl_s=60)
        generations.published("dispatch", [("op_probe0", 5)])
        assert not generations.superseded("dispatch", "op_probe0", 1)
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("dispatch")
        app.pool.force_close_all()
