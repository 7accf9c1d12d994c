"""A fresh success that may repeat an earlier attempt, answered to a worker fenced out
meanwhile, is kept as evidence marked `possible_duplicate` on an operation that stays
unknown; the reconcile that confirms on it opens the review of the possible duplicate in
the settling statement (a review a person already has open becomes it, not closed as
confirmed), on the in-memory twin and on Postgres alike. Unmarked evidence settles as
before: an open review is closed as confirmed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from opledger.adapters.registry import Registry
from opledger.dev.memory import MemoryLedger
from opledger.ledger import Ledger, Status
from opledger.ledger.evidence import POSSIBLE_DUPLICATE
from opledger.ledger.facades import WorkerLedger
from opledger.ledger.models import Verdict
from opledger.tasks.worker import FollowUps, Step, Worker, WorkerConfig
from tests.integration.test_possible_duplicate import ACTION, ForgetfulPay, _memory, _postgres

On = tuple[Any, Callable[[], datetime], Callable[[], None]]


@pytest.fixture(params=["memory", "postgres"])
def on(request: pytest.FixtureRequest) -> On:
    if request.param == "memory":
        return _memory()
    return _postgres(request.getfixturevalue("ledger"))


def _fence_out(ledger: WorkerLedger, op_id: str) -> None:
    """What the sweeper does to an expired lease: unknown, fence + 1."""
    if isinstance(ledger, MemoryLedger):
        ledger.clock.advance(timedelta(minutes=1))  # type: ignore[attr-defined]
    else:
        assert isinstance(ledger, Ledger)
        with ledger.engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE operations SET lease_expires_at = now() - interval '1 s' WHERE id = :id"
                ),
                {"id": op_id},
            )
    assert ledger.expire_leases() == [op_id]


def _fenced_out_success(on: On, lose: bool, review: bool) -> tuple[Any, str, list[str], Worker]:
    """A charge whose answer is lost, the provider restarted (`lose`) or not, a resend
    whose success comes back to a worker fenced out meanwhile (kept as evidence), and,
    when `review`, a person asked about the unknown operation; the ledger, the
    operation, the reviews the worker asked to notify, and the worker."""
    ledger, clock, advance = on
    pay = ForgetfulPay()
    opened: list[str] = []
    worker = Worker(
        ledger,
        Registry([pay]),
        owner="w1",
        clock=clock,
        config=WorkerConfig(lease=timedelta(seconds=30)),
        follow_ups=FollowUps(review_opened=opened.append),
    )
    grant = ledger.grant(tenant="acme", scope=["pay.*"], granted_by="t", ref="auth_pay").ref
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="charge-order-9",
        action=ACTION,
        target="order-9",
        payload={"amount": 2500},
        authorization_ref=grant,
    )
    pay.cut = True
    lost = worker.dispatch(op.id).operation
    assert lost is not None and lost.status is Status.UNKNOWN
    if lose:
        pay.restart()
    advance()
    claim = ledger.claim_retry(op.id, owner="w1", expected_fence=lost.fence)
    assert claim is not None and claim.attempt_n == 2
    _fence_out(ledger, op.id)  # the call outlived its lease
    assert worker.send(pay, claim).action is Step.FENCED
    history = ledger.history(op.id)
    assert history.operation.status is Status.UNKNOWN
    [kept] = [e for e in history.evidence if e.verdict is Verdict.CONFIRMED]
    assert (POSSIBLE_DUPLICATE in kept.detail) is lose
    if review:
        fence = history.operation.fence
        assert ledger.open_review(op.id, fence=fence, reason="nothing can tell") is not None
    return ledger, op.id, opened, worker


def _settles(worker: Worker, ledger: Any, op_id: str) -> Any:
    done = worker.reconcile(op_id)
    assert done.action is Step.CONFIRMED, done
    return ledger.history(op_id)


def test_settling_on_a_kept_possible_duplicate_opens_its_review(on: On) -> None:
    ledger, op_id, opened, worker = _fenced_out_success(on, lose=True, review=False)
    history = _settles(worker, ledger, op_id)
    assert history.operation.status is Status.CONFIRMED
    [review] = history.reviews
    assert review.resolved_at is None and review is not None
    assert review.reason.startswith(f"{POSSIBLE_DUPLICATE}: attempt 2 was answered"), review
    assert "may have applied the payment twice" in review.reason
    assert opened == [op_id]
    snap = review.snapshot
    assert snap["kind"] == POSSIBLE_DUPLICATE
    assert snap["fresh_success"]["attempt"] == 2
    assert snap["fresh_success"]["outcome"]["receipt_id"] == "ch_2"
    [earlier] = snap["earlier_attempts"]
    assert earlier["n"] == 1 and earlier["response"]["code"] == "connection_lost"
    assert "undo it" in snap["what_it_could_mean"]


def test_a_review_open_on_the_unknown_operation_becomes_the_possible_duplicates(
    on: On,
) -> None:
    ledger, op_id, opened, worker = _fenced_out_success(on, lose=True, review=True)
    history = _settles(worker, ledger, op_id)
    assert history.operation.status is Status.CONFIRMED
    [review] = history.reviews  # not closed as confirmed, none other opened
    assert review.resolved_at is None and review.resolution is None
    assert review.reason.startswith(POSSIBLE_DUPLICATE), review
    assert "may have applied the payment twice" in review.reason
    assert review.notified_at is None  # notified anew
    assert opened == [op_id]
    snap = review.snapshot
    assert snap["kind"] == POSSIBLE_DUPLICATE
    assert snap["review_before"]["reason"] == "nothing can tell"
    assert [a["n"] for a in snap["earlier_attempts"]] == [1]


def test_unmarked_evidence_settles_the_open_review_as_confirmed(on: On) -> None:
    ledger, op_id, opened, worker = _fenced_out_success(on, lose=False, review=True)
    history = _settles(worker, ledger, op_id)
    assert history.operation.status is Status.CONFIRMED
    assert history.open_review is None and opened == []
    [review] = history.reviews
    assert (review.reason, review.resolution) == ("nothing can tell", "confirmed")
