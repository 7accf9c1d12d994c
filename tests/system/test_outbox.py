"""The outbox: prepare in the caller's transaction, publish only after it commits."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from opledger.dev.processes import PrivateRedis, Stack
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.outbox import prepare_and_dispatch

from .conftest import settled

pytestmark = pytest.mark.system

INTENT = dict(
    tenant="acme",
    workflow_id="onboarding-42",
    action="crm.close_case.v1",
    target="case-318",
    payload={"note": "resolved"},
    authorization_ref="auth_acme",
)


def test_nothing_is_published_before_commit_and_nothing_after_rollback(
    stack: Stack, sys_ledger: Ledger, private_redis: PrivateRedis
) -> None:
    for name in list(stack.workers):
        stack.kill_worker(name)  # keep the queue still so it can be counted
    before = private_redis.queued("dispatch")
    with Session(sys_ledger.engine) as session:
        session.execute(text("SELECT 1"))
        prepare_and_dispatch(sys_ledger, session=session, intent_key="rolled-back", **INTENT)
        assert private_redis.queued("dispatch") == before
        session.rollback()
    assert private_redis.queued("dispatch") == before
    with Session(sys_ledger.engine) as session:
        op = prepare_and_dispatch(sys_ledger, session=session, intent_key="committed", **INTENT)
        assert private_redis.queued("dispatch") == before
        session.commit()
    assert private_redis.queued("dispatch") == before + 1
    assert sys_ledger.list(status=[Status.PREPARED]) == (sys_ledger.get(op.id),)


def test_a_committed_outbox_operation_is_dispatched(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    with Session(sys_ledger.engine) as session:
        op = prepare_and_dispatch(sys_ledger, session=session, intent_key="close", **INTENT)
        session.commit()
    assert settled(sys_ledger, [op.id]) == {op.id: Status.CONFIRMED}
    assert op.idempotency_key.startswith("opk_")
    assert sandbox.effects(f"crm:{op.idempotency_key}") == 1


def test_each_task_reaches_its_own_queue_only(running: Stack, private_redis: PrivateRedis) -> None:
    """With the bindings a running worker declared: a message must land in one queue."""
    from opledger.tasks.app import dispatch, notify_review, reconcile, sweep

    for name in list(running.workers):
        running.kill_worker(name)
    if running.beat is not None:
        running.beat.kill()
        running.beat = None
    queues = ("dispatch", "reconcile", "maintenance", "notifications")
    before = {q: private_redis.queued(q) for q in queues}
    op_id = "op_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    for task, queue in (
        (dispatch, "dispatch"),
        (reconcile, "reconcile"),
        (notify_review, "notifications"),
    ):
        task.delay(op_id)
        grown = {q: private_redis.queued(q) - before[q] for q in queues}
        assert grown == {q: int(q == queue) for q in queues}, (task.name, grown)
        before = {q: private_redis.queued(q) for q in queues}
    sweep.delay()
    grown = {q: private_redis.queued(q) - before[q] for q in queues}
    assert grown == {q: int(q == "maintenance") for q in queues}
