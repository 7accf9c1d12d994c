"""The fenced claim and the outcome written under it."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Barrier

import pytest
from sqlalchemy import text

from opledger.ledger import (
    Ambiguous,
    AuthorizationRevoked,
    Binding,
    Confirmed,
    ForbiddenTransition,
    ForgedFence,
    Ledger,
    Rejected,
    StaleFence,
    Status,
)
from tests.intents import Intent, derived_key

CLOSE = Intent(
    tenant="acme",
    workflow_id="wf-1",
    intent_key="close",
    action="crm.close_case.v1",
    target="case-318",
    payload={"status": "closed"},
    authorization_ref="auth_acme",
)


def receipt(claim_key: str, **binding: str) -> Confirmed:
    return Confirmed(receipt_id="rcpt-1", binding=Binding(idempotency_key=claim_key, **binding))


def test_claim_fences_leases_records_the_attempt_and_returns_the_frozen_payload(
    ledger: Ledger, grant: str
) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1", lease=timedelta(seconds=30))
    assert claim is not None
    assert claim.fence == 1 and claim.attempt_n == 1
    assert claim.payload == {"status": "closed"}
    assert claim.idempotency_key == op.idempotency_key == derived_key(ledger, CLOSE)
    assert claim.deadline_at > claim.started_at
    now = ledger.get(op.id)
    assert now.status is Status.DISPATCHING
    assert now.lease_owner == "w1" and now.lease_expires_at is not None
    history = ledger.history(op.id)
    assert [(a.n, a.fence, a.finished_at) for a in history.attempts] == [(1, 1, None)]


def test_a_second_claim_gets_nothing(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    assert ledger.claim(op.id, owner="w1") is not None
    assert ledger.claim(op.id, owner="w2") is None
    assert (
        ledger.claim_retry(
            op.id,
            owner="w2",
            expected_fence=ledger.get(op.id).fence,
        )
        is None
    )
    assert ledger.get(op.id).fence == 1


@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (Rejected(code="invalid_case", reason="case does not exist"), Status.REJECTED),
        (Ambiguous(code="timeout", reason="read timed out"), Status.UNKNOWN),
    ],
)
def test_outcomes_move_the_status_and_keep_evidence(
    ledger: Ledger, grant: str, outcome: Rejected | Ambiguous, status: Status
) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    after = ledger.record_outcome(claim, outcome)
    assert after.status is status
    assert after.lease_owner is None
    history = ledger.history(op.id)
    assert history.attempts[0].outcome == outcome.kind
    assert history.attempts[0].finished_at is not None
    assert [(e.verdict, e.applied, e.source) for e in history.evidence] == [
        (outcome.kind, True, "dispatch")
    ]
    if status is Status.UNKNOWN:
        assert after.next_check_at is not None


def test_a_confirmation_binds_the_receipt(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    after = ledger.record_outcome(
        claim, receipt(claim.idempotency_key, target="case-318", resulting_version="7")
    )
    assert after.status is Status.CONFIRMED
    assert after.provider_result_id == "rcpt-1"
    (ev,) = ledger.history(op.id).evidence
    assert ev.binding.idempotency_key == op.idempotency_key and ev.binding.resulting_version == "7"


def test_a_receipt_for_another_key_or_target_confirms_nothing(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    after = ledger.record_outcome(claim, receipt(claim.idempotency_key, target="case-999"))
    assert after.status is Status.UNKNOWN
    (ev,) = ledger.history(op.id).evidence
    assert ev.verdict == "ambiguous" and ev.detail["code"] == "binding_mismatch"


def test_a_stale_fence_cannot_move_anything_and_its_outcome_is_kept(
    ledger: Ledger, grant: str
) -> None:
    op = ledger.prepare(**CLOSE)
    old = ledger.claim(op.id, owner="w1")
    assert old is not None
    ledger.record_outcome(old, Ambiguous(code="timeout", reason="lost"))
    new = ledger.claim_retry(
        op.id,
        owner="w2",
        expected_fence=ledger.get(op.id).fence,
    )
    assert new is not None and new.fence == 2 and new.attempt_n == 2
    # the first worker's (already reported) claim cannot report again
    with pytest.raises(StaleFence):
        ledger.record_outcome(old, receipt(old.idempotency_key))
    assert ledger.get(op.id).status is Status.DISPATCHING
    ledger.record_outcome(new, receipt(new.idempotency_key))
    assert ledger.get(op.id).status is Status.CONFIRMED


def test_a_late_outcome_after_being_fenced_out_lands_as_evidence(
    ledger: Ledger, grant: str
) -> None:
    op = ledger.prepare(**CLOSE)
    stalled = ledger.claim(op.id, owner="w1")
    assert stalled is not None
    # what the sweeper does to an expired lease: unknown, fence + 1
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE operations SET status = 'unknown', fence = fence + 1, lease_owner = NULL,"
                " lease_token = NULL, lease_expires_at = NULL, changed_by = 'sweeper',"
                " change_reason = 'lease expired' WHERE id = :id"
            ),
            {"id": op.id},
        )
    with pytest.raises(StaleFence) as info:
        ledger.record_outcome(stalled, receipt(stalled.idempotency_key))
    assert info.value.fields["evidence_kept"] is True
    after = ledger.get(op.id)
    assert after.status is Status.UNKNOWN and after.fence == 2
    history = ledger.history(op.id)
    assert [(e.verdict, e.applied, e.fence) for e in history.evidence] == [("confirmed", False, 1)]
    assert history.attempts[0].outcome == "confirmed"


def test_a_forged_claim_is_refused_and_writes_nothing(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    for forged in (
        claim.model_copy(update={"token": "0" * 32}),
        claim.model_copy(update={"fence": 5}),
    ):
        with pytest.raises(ForgedFence):
            ledger.record_outcome(forged, receipt(claim.idempotency_key))
    assert ledger.get(op.id).status is Status.DISPATCHING
    assert ledger.history(op.id).evidence == ()


def test_claims_racing_from_many_threads_have_one_winner(ledger: Ledger, grant: str) -> None:
    ops = [ledger.prepare(**(CLOSE | {"intent_key": f"k{i}"})) for i in range(5)]
    threads = 8
    for op in ops:
        barrier = Barrier(threads)

        def take(i: int, op_id: str = op.id, barrier: Barrier = barrier) -> bool:
            barrier.wait()
            return ledger.claim(op_id, owner=f"t{i}") is not None

        with ThreadPoolExecutor(threads) as pool:
            won = list(pool.map(take, range(threads)))
        assert sum(won) == 1
        assert ledger.get(op.id).fence == 1
        assert len(ledger.history(op.id).attempts) == 1


def test_revoked_before_a_claim_cancels_the_prepared_operation(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    ledger.revoke("auth_acme", by="security", reason="key leaked")
    with pytest.raises(AuthorizationRevoked):
        ledger.claim(op.id, owner="w1")
    after = ledger.get(op.id)
    assert after.status is Status.CANCELLED
    assert ledger.history(op.id).attempts == ()
    assert ledger.history(op.id).transitions[-1].reason == "authorization revoked"


def test_revoked_while_unknown_refuses_a_new_write_and_erases_nothing(
    ledger: Ledger, grant: str
) -> None:
    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="lost"))
    ledger.revoke("auth_acme", by="security", reason="key leaked")
    with pytest.raises(AuthorizationRevoked):
        ledger.claim_retry(
            op.id,
            owner="w2",
            expected_fence=ledger.get(op.id).fence,
        )
    after = ledger.get(op.id)
    assert after.status is Status.UNKNOWN and after.fence == 1
    assert len(ledger.history(op.id).evidence) == 1


def test_an_expired_grant_counts_as_revoked(ledger: Ledger) -> None:
    from datetime import UTC, datetime

    ledger.grant(
        tenant="acme",
        scope=["crm.*"],
        granted_by="t",
        ref="auth_short",
        expires_at=datetime.now(UTC) + timedelta(seconds=1),
    )
    op = ledger.prepare(**(CLOSE | {"authorization_ref": "auth_short"}))
    time.sleep(1.2)
    with pytest.raises(AuthorizationRevoked):
        ledger.claim(op.id, owner="w1")
    assert ledger.get(op.id).status is Status.CANCELLED


def test_cancel_only_a_prepared_operation(ledger: Ledger, grant: str) -> None:
    a = ledger.prepare(**CLOSE)
    cancelled = ledger.cancel(a.id, reason="customer withdrew")
    assert cancelled.status is Status.CANCELLED and cancelled.fence == 1
    assert ledger.claim(a.id, owner="w1") is None
    b = ledger.prepare(**(CLOSE | {"intent_key": "other"}))
    assert ledger.claim(b.id, owner="w1") is not None
    with pytest.raises(ForbiddenTransition):
        ledger.cancel(b.id, reason="too late")


def test_a_confirmations_result_is_kept_bounded_and_returned_as_data(
    ledger: Ledger, grant: str
) -> None:
    from opledger.agents import Effects
    from opledger.ledger.evidence import RESULT_LIMIT

    op = ledger.prepare(**CLOSE)
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    result = {"id": "case-318", "version": 7}
    confirmed = receipt(claim.idempotency_key, target="case-318").model_copy(
        update={"result": result}
    )
    assert ledger.record_outcome(claim, confirmed).status is Status.CONFIRMED
    (ev,) = ledger.history(op.id).evidence
    assert ev.detail["result"] == result
    effects = Effects(ledger, publish=lambda op_id: None)
    answer = effects.result(op.id)
    assert answer.kind == "confirmed" and answer.data == result

    # too large to keep: the outcome stands, the document is a note saying why
    other: Intent = {**CLOSE, "intent_key": "close-big", "target": "case-319"}
    big = ledger.prepare(**other)
    claim = ledger.claim(big.id, owner="w1")
    assert claim is not None
    oversized = receipt(claim.idempotency_key, target="case-319").model_copy(
        update={"result": {"blob": "x" * RESULT_LIMIT}}
    )
    assert ledger.record_outcome(claim, oversized).status is Status.CONFIRMED
    data = effects.result(big.id)
    assert data.kind == "confirmed" and "omitted" in data.data and "blob" not in data.data
    # a lookup's result is bounded the same way
    looked = ledger.record_evidence(
        big.id, source="lookup", verdict="confirmed", detail={"result": {"n": float("inf")}}
    )
    assert "omitted" in looked.detail["result"]
