"""At most one outstanding message per operation, with real workers and a real Redis."""

from __future__ import annotations

import time

import pytest

from opledger.dev.chaos.stack import PrivateRedis, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch
from opledger.tasks.backlog import SENT_HEADER, Generations, queue_depth

from .conftest import prepare, settled

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
    assert sandbox.effects(f"crm:{op_id}") == 1


def test_queue_depth_is_read_through_kombu(running: Stack, private_redis: PrivateRedis) -> None:
    from opledger.tasks.app import app

    assert queue_depth(app, "no-such-queue") == 0
    assert queue_depth(app, "dispatch") == private_redis.queued("dispatch")
