"""The worker as a plain object (`tasks.worker.Worker`) over the in-memory twin of the
ledger (`dev.memory.MemoryLedger`), on a fake clock, with the real CRM adapter talking to
an httpx `MockTransport`: step orchestration in milliseconds, no Postgres, no sleeping.
The twin agrees with Postgres on a worker's path: `tests/integration/test_memory_twin.py`.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from opledger.adapters.registry import Registry
from opledger.ledger import StaleFence, Status
from opledger.ledger.decide import NeedsReview
from opledger.tasks.results import Step
from opledger.tasks.worker import FollowUps, Worker, WorkerConfig
from tests.workerrig import LEASE, Rig


@pytest.fixture
def rig() -> Rig:
    return Rig()


def test_a_dispatch_that_is_answered_is_confirmed(rig: Rig) -> None:
    op = rig.prepare()
    result = rig.worker.dispatch(op.id)
    assert result.action is Step.DISPATCHED
    assert result.operation is not None and result.operation.status is Status.CONFIRMED
    assert rig.statuses(op.id) == ["prepared", "dispatching", "confirmed"]
    assert rig.crm.applied == 1
    assert rig.worker.dispatch(op.id).action is Step.NOOP  # a redelivery sends nothing
    assert rig.crm.applied == 1


def test_a_lost_answer_is_reconciled_by_a_lookup(rig: Rig) -> None:
    op = rig.prepare()
    rig.crm.mode = "lost"
    assert rig.worker.dispatch(op.id).action is Step.DISPATCHED
    assert rig.ledger.get(op.id).status is Status.UNKNOWN
    settled = rig.worker.reconcile(op.id)  # the status API answers what it stored
    assert settled.action is Step.CONFIRMED
    assert rig.statuses(op.id) == ["prepared", "dispatching", "unknown", "confirmed"]
    assert rig.crm.applied == 1  # found by its key, never sent again
    sources = [e.source.value for e in rig.ledger.history(op.id).evidence]
    assert sources == ["dispatch", "lookup"]


def test_a_request_that_never_arrived_is_sent_again_after_its_in_flight_deadline(
    rig: Rig,
) -> None:
    op = rig.prepare()
    rig.crm.mode = "dropped"
    rig.worker.dispatch(op.id)
    rig.crm.mode = "ok"
    early = rig.worker.reconcile(op.id)  # absent, but the attempt may still arrive: wait
    assert early.action is Step.WAITING
    assert rig.crm.applied == 0
    rig.clock.advance(timedelta(seconds=10))
    again = rig.worker.reconcile(op.id)
    assert again.action is Step.DISPATCHED
    assert again.operation is not None and again.operation.status is Status.CONFIRMED
    attempts = rig.ledger.history(op.id).attempts
    assert [a.idempotency_key for a in attempts] == [op.idempotency_key] * 2  # same key
    assert rig.crm.applied == 1


def test_a_lost_answer_nothing_can_find_goes_to_a_person_at_the_deadline() -> None:
    rig = Rig(lookup="none", keys=False)  # no key, no lookup: a retry could apply it twice
    op = rig.prepare()
    rig.crm.mode = "lost"
    rig.worker.dispatch(op.id)
    assert rig.worker.reconcile(op.id).action is Step.WAITING  # still in flight
    assert rig.followed == []
    rig.clock.advance(timedelta(seconds=10))
    result = rig.worker.reconcile(op.id)
    assert result.action is Step.REVIEW
    assert isinstance(result.decision, NeedsReview)
    assert result.operation is not None and result.operation.status is Status.UNKNOWN
    review = rig.ledger.history(op.id).open_review
    assert review is not None and review.snapshot["consequences"]
    assert rig.followed == [("review", op.id)]
    assert rig.worker.reconcile(op.id).action is Step.REVIEW  # a person has it: nothing new
    assert rig.followed == [("review", op.id)]
    assert rig.crm.applied == 1


def test_a_provider_refusal_rejects_it(rig: Rig) -> None:
    op = rig.prepare()
    rig.crm.mode = "refuse"
    result = rig.worker.dispatch(op.id)
    assert result.operation is not None and result.operation.status is Status.REJECTED
    attempt = rig.ledger.history(op.id).attempts[0]
    assert attempt.outcome == "rejected"
    assert rig.crm.applied == 0


def test_a_worker_fenced_out_mid_call_keeps_its_answer_and_asks_for_a_reconcile(rig: Rig) -> None:
    op = rig.prepare()

    def lease_expires() -> None:  # the call outlives the lease; the sweeper fences it out
        rig.clock.advance(LEASE + timedelta(seconds=1))
        assert rig.ledger.expire_leases() == [op.id]

    rig.crm.before_answer = lease_expires
    assert rig.worker.dispatch(op.id).action is Step.FENCED
    history = rig.ledger.history(op.id)
    assert history.operation.status is Status.UNKNOWN and history.operation.fence == 2
    assert [e.applied for e in history.evidence] == [False]  # kept, not applied
    assert rig.followed == [("reconcile", op.id)]
    assert rig.worker.reconcile(op.id).action is Step.CONFIRMED  # settled on its own answer
    assert rig.crm.applied == 1


def test_the_twin_refuses_a_stale_fence_like_the_ledger(rig: Rig) -> None:
    op = rig.prepare()
    claim = rig.ledger.claim(op.id, owner="w1", terms=rig.registry.claim_terms(LEASE))
    assert claim is not None
    rig.clock.advance(LEASE + timedelta(seconds=1))
    assert rig.ledger.expire_leases() == [op.id]
    with pytest.raises(StaleFence):
        rig.ledger.settle(
            op.id, fence=claim.fence, to=Status.CONFIRMED, evidence_id=1, actor="w", reason="r"
        )
    with pytest.raises(StaleFence):
        rig.ledger.schedule_check(op.id, fence=claim.fence, at=rig.clock())
    assert rig.ledger.claim_retry(op.id, owner="w2", expected_fence=claim.fence) is None
    assert rig.worker.send(rig.adapter, claim).action is Step.FENCED
    assert rig.ledger.get(op.id).fence == 2


def test_a_revoked_grant_cancels_before_anything_is_sent(rig: Rig) -> None:
    op = rig.prepare()
    rig.ledger.revoke(rig.grant)
    assert rig.worker.dispatch(op.id).action is Step.CANCELLED
    assert rig.ledger.get(op.id).status is Status.CANCELLED
    assert rig.crm.applied == 0


def test_an_action_no_adapter_serves_is_held_then_reviewed(rig: Rig) -> None:
    bare = Worker(rig.ledger, Registry(), owner="w1", clock=rig.clock)
    op = rig.prepare()
    held = bare.dispatch(op.id)
    assert held.action is Step.HELD
    assert held.operation is not None and held.operation.next_check_at is not None
    rig.clock.advance(timedelta(days=2))  # longer than the review policy's 24 hours
    assert bare.reconcile(op.id).action is Step.REVIEW
    assert rig.crm.applied == 0


def test_a_review_notification_is_an_operation_of_its_own_prepared_once() -> None:
    rig = Rig(lookup="none", keys=False)
    dispatched: list[str] = []
    notifier = Worker(
        rig.ledger,
        rig.registry,
        owner="w1",
        config=WorkerConfig(review_webhook_url="https://hooks.test/review"),
        clock=rig.clock,
        follow_ups=FollowUps(dispatch=dispatched.append),
    )
    op = rig.prepare()
    assert notifier.notify_review(op.id) == "noop"  # no review open
    rig.crm.mode = "lost"
    rig.worker.dispatch(op.id)
    rig.clock.advance(timedelta(seconds=10))
    rig.worker.reconcile(op.id)
    rig.ledger.grant(tenant="acme", scope=["webhook.*"], granted_by="t", ref="opledger-notify-acme")
    assert notifier.notify_review(op.id) == "prepared"
    assert notifier.notify_review(op.id) == "prepared"  # a redelivery: the same operation
    assert len(set(dispatched)) == 1
    note = rig.ledger.get(dispatched[0])
    assert note.action == "webhook.post.v1" and note.workflow_id == f"review:{op.id}"
    assert note.status is Status.PREPARED
    assert rig.worker.notify_review(op.id) == "skipped"  # no webhook configured
