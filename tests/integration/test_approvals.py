"""Approvals on a real Postgres: an act its action's policy asks a person about waits before
any claim (no fence, no attempt, nothing relayed), bound to its operation, its frozen
payload's digest and its grant; the last approval needed releases it, and the first claim
consumes it, once; an act asked again never asks twice; a stale digest, an agent or the
asker, one person twice, a revoked grant are refused; a denial and an expiry cancel it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.console.accounts import Accounts
from opledger.ledger import (
    Ambiguous,
    ApprovalAlreadyDecided,
    ApprovalAlreadyGiven,
    ApprovalError,
    ApprovalNotFound,
    AuthorizationRevoked,
    InvalidInput,
    Ledger,
    NotAnApprover,
    Operation,
    StaleApproval,
    Status,
)
from opledger.ledger.intents import Intent

REFUND, CHARGE = "stripe.refund.v1", "stripe.charge.v1"
#: refunds above 10000 need one person, charges above 10000 two
POLICIES = {
    REFUND: {"when": [{"field": "amount", "above": 10000}]},
    CHARGE: {"when": [{"field": "amount", "above": 10000}], "approvers": 2},
}


@pytest.fixture
def approving(ledger: Ledger) -> Ledger:
    """A ledger with the bundled Stripe and CRM adapters under `POLICIES`; acme's grant
    `auth_s` covers Stripe; operators alice and bob approve Stripe's acts for acme, carol
    only the CRM's, dave acts for another tenant, eve is disabled, mallory is who asks."""
    registry = Registry(
        [
            StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123"),
            CrmAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    for action, policy in POLICIES.items():
        registry.require_approval(action, policy)
    ledger.grant(tenant="acme", scope=["stripe.*", "crm.*"], granted_by="test", ref="auth_s")
    accounts = Accounts(ledger.engine)
    for name, tenants, approves in (
        ("alice", ["acme"], ["stripe.*"]),
        ("bob", ["acme"], ["stripe.*"]),
        ("carol", ["acme"], ["crm.*"]),
        ("dave", ["globex"], ["*"]),
        ("eve", ["acme"], ["*"]),
        ("mallory", ["acme"], ["*"]),
    ):
        accounts.add(name, tenants=tenants, password=None, by="test", approves=approves)
    accounts.disable("eve", by="test")
    return Ledger(ledger.engine, actions=registry)


def refund(ledger: Ledger, amount: int, *, run: str = "run-1", actor: str = "agent") -> Operation:
    """A refund of charge ch_1 (an act of the tenant: the same from any run)."""
    intent = Intent(
        tenant="acme",
        workflow_id=run,
        action=REFUND,
        target="ch_1",
        payload={"amount": amount, "reason": "duplicate"},
        authorization_ref="auth_s",
        asked_by="call-1",
    )
    return ledger.ask_intent(intent, actor=actor).operation


def charge(ledger: Ledger, amount: int, key: str = "charge-1", **options: Any) -> Operation:
    return ledger.prepare(
        tenant="acme",
        workflow_id="run-1",
        intent_key=key,
        action=CHARGE,
        target="order-1",
        payload={"amount": amount, "currency": "usd", "source": "tok_visa"},
        authorization_ref="auth_s",
        **options,
    )


def count(ledger: Ledger, sql: str, **params: Any) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def sql(ledger: Ledger, statement: str, **params: Any) -> None:
    with ledger.engine.begin() as conn:
        conn.execute(text(statement), params)


def relayed(ledger: Ledger) -> list[str]:
    published: list[str] = []
    ledger.relay(older_than=timedelta(0), publish=lambda op_id, gen: published.append(op_id))
    return published


def test_an_act_above_the_threshold_waits_before_any_claim(approving: Ledger) -> None:
    small, big = refund(approving, 500), refund(approving, 25_000, run="run-2")
    assert small.waiting_on == 0
    with pytest.raises(ApprovalNotFound):
        approving.approval(small.id)
    assert big.status is Status.PREPARED and big.waiting_on == 1
    asked = approving.approval(big.id)
    assert (asked.status, asked.approvers_required, asked.approved_by) == ("pending", 1, ())
    assert asked.payload_digest == big.payload_digest
    assert asked.authorization_ref == "auth_s" and asked.requested_by == "agent"
    assert asked.asked_by == "call-1" and asked.reasons == ("amount 25000 is above 10000",)
    # nothing is sent: no claim, no fence, no attempt; the relay publishes only the other
    assert approving.claim(big.id, owner="w") is None
    after = approving.get(big.id)
    assert (after.status, after.fence) == (Status.PREPARED, big.fence)
    assert count(approving, "SELECT count(*) FROM attempts WHERE op_id = :id", id=big.id) == 0
    assert relayed(approving) == [small.id]
    assert [a.op_id for a in approving.approvals(tenant="acme")] == [big.id]


def test_an_approval_releases_the_act_and_the_first_claim_consumes_it_once(
    approving: Ledger,
) -> None:
    op = refund(approving, 25_000)
    approved = approving.approve(op.id, operator="alice", digest=op.payload_digest, note="ok")
    assert (approved.status, approved.approved_by, approved.decided_by) == (
        "approved",
        ("alice",),
        "alice",
    )
    assert approving.get(op.id).waiting_on == 0
    assert relayed(approving) == [op.id]  # released: published at once
    claim = approving.claim(op.id, owner="w1")
    assert claim is not None
    assert approving.claim(op.id, owner="w2") is None
    consumed = approving.approval(op.id)
    assert consumed.consumed_fence == claim.fence and consumed.consumed_at is not None
    # a retry of the same effect runs under it, and does not consume it again
    approving.record_outcome(claim, Ambiguous(code="timeout", reason="no answer"))
    retry = approving.claim_retry(op.id, owner="w3", expected_fence=claim.fence)
    assert retry is not None and retry.fence > claim.fence
    assert approving.approval(op.id).consumed_fence == claim.fence
    decisions = approving.approval_decisions(op.id)
    assert [(d.operator, d.decision, d.payload_digest) for d in decisions] == [
        ("alice", "approved", op.payload_digest)
    ]
    assert decisions[0].shown == {"amount": 25_000, "reason": "duplicate"}


def test_a_consumed_approval_never_admits_a_second_first_claim(approving: Ledger) -> None:
    """Belt and braces: even were the operation prepared again, an approval a first claim
    consumed is spent."""
    op = refund(approving, 25_000)
    approving.approve(op.id, operator="alice", digest=op.payload_digest)
    sql(
        approving,
        "UPDATE approvals SET consumed_at = now(), consumed_fence = 1 WHERE op_id = :id",
        id=op.id,
    )
    assert approving.claim(op.id, owner="w") is None


def test_the_claim_guard_holds_a_broken_binding_even_without_the_hold(approving: Ledger) -> None:
    op = refund(approving, 25_000)
    sql(approving, "UPDATE operations SET waiting_on = 0 WHERE id = :id", id=op.id)
    assert approving.claim(op.id, owner="w") is None  # pending
    sql(
        approving,
        "UPDATE approvals SET status = 'approved', payload_digest = :d WHERE op_id = :id",
        id=op.id,
        d="0" * 64,
    )
    assert approving.claim(op.id, owner="w") is None  # approved, but for another payload
    sql(
        approving,
        "UPDATE approvals SET payload_digest = :d, authorization_ref = 'auth_other' "
        "WHERE op_id = :id",
        id=op.id,
        d=op.payload_digest,
    )
    assert approving.claim(op.id, owner="w") is None  # approved, but under another grant
    sql(approving, "UPDATE approvals SET authorization_ref = 'auth_s' WHERE op_id = :id", id=op.id)
    assert approving.claim(op.id, owner="w") is not None  # the exact binding: claimed


def test_the_same_act_asked_again_never_asks_twice(approving: Ledger) -> None:
    op = refund(approving, 25_000)
    again = refund(approving, 25_000, run="run-2", actor="another-agent")  # another run
    assert again.id == op.id
    approving.approve(op.id, operator="alice", digest=op.payload_digest)
    after = refund(approving, 25_000, run="run-3")
    assert after.id == op.id and approving.approval(op.id).status == "approved"
    assert count(approving, "SELECT count(*) FROM approvals") == 1
    # a changed payload is a new act, with its own approval
    other = refund(approving, 30_000)
    assert other.id != op.id and other.waiting_on == 1
    assert approving.approval(other.id).status == "pending"
    assert approving.claim(other.id, owner="w") is None
    # a run's act replayed through prepare: the same operation, no second request
    first = charge(approving, 50_000)
    assert charge(approving, 50_000).id == first.id
    assert count(approving, "SELECT count(*) FROM approvals") == 3


def test_a_digest_not_the_operations_is_refused(approving: Ledger) -> None:
    op = refund(approving, 25_000)
    other = refund(approving, 30_000)
    with pytest.raises(StaleApproval) as refused:
        approving.approve(op.id, operator="alice", digest=other.payload_digest)
    assert refused.value.digest == op.payload_digest
    with pytest.raises(StaleApproval):
        approving.deny(op.id, operator="alice", digest="0" * 64, note="no")
    assert approving.approval(op.id).status == "pending"
    assert approving.get(op.id).waiting_on == 1
    assert approving.approval_decisions(op.id) == ()


@pytest.mark.parametrize(
    ("who", "why"),
    [
        ("agent", "is not an operator"),  # the actor that asked: no operator at all
        ("call-1", "is not an operator"),  # the asker's own id
        ("mallory", "the asker never approves"),  # an operator who asked for it
        ("carol", "may not approve"),  # approves the CRM's acts only
        ("dave", "may not approve"),  # another tenant's
        ("eve", "may not approve"),  # disabled
    ],
)
def test_only_an_operator_who_may_approve_and_did_not_ask_approves(
    approving: Ledger, who: str, why: str
) -> None:
    op = refund(approving, 25_000, actor="mallory")
    with pytest.raises(NotAnApprover, match=why):
        approving.approve(op.id, operator=who, digest=op.payload_digest)
    assert approving.approval(op.id).approved_by == ()
    assert approving.get(op.id).waiting_on == 1


def test_two_approvers_are_two_people(approving: Ledger) -> None:
    op = charge(approving, 50_000)
    half = approving.approve(op.id, operator="alice", digest=op.payload_digest)
    assert (half.status, half.approved_by, half.approvals_missing) == ("pending", ("alice",), 1)
    assert approving.get(op.id).waiting_on == 1
    assert approving.claim(op.id, owner="w") is None
    with pytest.raises(ApprovalAlreadyGiven):
        approving.approve(op.id, operator="alice", digest=op.payload_digest)
    assert approving.approval(op.id).approved_by == ("alice",)
    assert approving.claim(op.id, owner="w") is None
    done = approving.approve(op.id, operator="bob", digest=op.payload_digest)
    assert (done.status, done.approved_by) == ("approved", ("alice", "bob"))
    assert approving.claim(op.id, owner="w") is not None


def _at_once(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run `calls` in threads released together; what each returned or raised."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = calls[i]()
        except ApprovalError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _approve_at_once(ledger: Ledger, op: Operation) -> list[Any]:
    return _at_once(
        [
            lambda: ledger.approve(op.id, operator="alice", digest=op.payload_digest),
            lambda: ledger.approve(op.id, operator="bob", digest=op.payload_digest),
        ]
    )


def _claim_at_once(ledger: Ledger, op: Operation) -> list[Any]:
    return _at_once(
        [lambda: ledger.claim(op.id, owner="w1"), lambda: ledger.claim(op.id, owner="w2")]
    )


def test_two_approvals_at_once_release_once(approving: Ledger) -> None:
    for n in range(4):
        op = refund(approving, 20_000 + n)
        results = _approve_at_once(approving, op)
        refused = [r for r in results if isinstance(r, ApprovalError)]
        assert len(refused) == 1 and isinstance(refused[0], ApprovalAlreadyDecided)
        assert [r.released for r in results if not isinstance(r, ApprovalError)] == [True]
        assert approving.get(op.id).waiting_on == 0
        assert len(approving.approval_decisions(op.id)) == 1
        assert sum(c is not None for c in _claim_at_once(approving, op)) == 1
        # two people at once where two are needed: both count, released once
        two = charge(approving, 50_000 + n, key=f"charge-{n}")
        both = _approve_at_once(approving, two)
        assert not [r for r in both if isinstance(r, ApprovalError)]
        assert sorted(r.released for r in both) == [False, True]
        assert approving.approval(two.id).status == "approved"
        assert approving.get(two.id).waiting_on == 0
        assert sum(c is not None for c in _claim_at_once(approving, two)) == 1


def test_a_denial_cancels_the_act_and_what_runs_after_it(approving: Ledger) -> None:
    op = charge(approving, 50_000)
    later = charge(approving, 10, key="charge-after", after=[op.id])
    approving.approve(op.id, operator="bob", digest=op.payload_digest)  # one of two
    denied = approving.deny(op.id, operator="alice", digest=op.payload_digest, note="too big")
    assert denied.status == "denied" and denied.decided_by == "alice"
    answer = approving.answer(op.id)
    assert answer.operation.status is Status.CANCELLED
    assert answer.last_reason == "denied by alice: too big"
    assert approving.get(later.id).status is Status.CANCELLED
    assert [d.decision for d in approving.approval_decisions(op.id)] == ["approved", "denied"]
    with pytest.raises(ApprovalAlreadyDecided):
        approving.approve(op.id, operator="alice", digest=op.payload_digest)
    assert approving.claim(op.id, owner="w") is None
    assert approving.approvals(tenant="acme") == ()


def test_a_persons_note_keeps_its_lines_and_refuses_control_characters(
    approving: Ledger,
) -> None:
    op, other = refund(approving, 25_000), refund(approving, 26_000)
    with pytest.raises(InvalidInput, match="control"):
        approving.approve(op.id, operator="alice", digest=op.payload_digest, note="ok\x07")
    assert approving.approval(op.id).status == "pending"  # nothing was decided
    approving.approve(
        op.id, operator="alice", digest=op.payload_digest, note="checked the charge\r\nticket 12"
    )
    note = "wrong customer:\nthe card is another's"
    approving.deny(other.id, operator="alice", digest=other.payload_digest, note=note)
    assert [d.note for d in approving.approval_decisions(op.id)] == [
        "checked the charge\nticket 12"
    ]
    assert approving.answer(other.id).last_reason == f"denied by alice: {note}"


def test_an_approval_not_given_in_time_expires_and_cancels(approving: Ledger) -> None:
    op, fresh = refund(approving, 25_000), refund(approving, 26_000)
    sql(approving, "UPDATE approvals SET expires_at = now() WHERE op_id = :id", id=op.id)
    with pytest.raises(ApprovalAlreadyDecided, match="expired"):
        approving.approve(op.id, operator="alice", digest=op.payload_digest)
    approving.expire_leases()  # the sweep
    assert approving.approval(op.id).status == "expired"
    cancelled = approving.get(op.id)
    assert cancelled.status is Status.CANCELLED
    assert str(approving.answer(op.id).last_reason).startswith("approval expired: 0 of 1")
    assert approving.approval(fresh.id).status == "pending"  # not yet due: untouched
    assert approving.expire_approvals() == []


def test_a_revoked_grant_is_refused_with_the_reason(approving: Ledger) -> None:
    op, other = refund(approving, 25_000), refund(approving, 26_000)
    approving.revoke("auth_s", by="test", reason="leaked")
    with pytest.raises(AuthorizationRevoked, match="no longer active"):
        approving.approve(op.id, operator="alice", digest=op.payload_digest)
    assert approving.approval(op.id).status == "pending"
    # a denial needs no live grant
    approving.deny(op.id, operator="alice", digest=op.payload_digest, note="grant revoked")
    assert approving.get(op.id).status is Status.CANCELLED
    # the claim refuses it anyway, hold or no hold
    sql(approving, "UPDATE operations SET waiting_on = 0 WHERE id = :id", id=other.id)
    with pytest.raises(AuthorizationRevoked):
        approving.claim(other.id, owner="w")
    assert count(approving, "SELECT count(*) FROM attempts") == 0


def test_the_request_is_written_in_the_transaction_that_records_the_act(
    approving: Ledger,
) -> None:
    """Through the outbox (the caller's session): the operation and its approval request
    commit together, or neither does."""
    with Session(approving.engine) as session:
        dropped = charge(approving, 50_000, key="dropped", session=session)
        session.rollback()
    with Session(approving.engine) as session:
        kept = charge(approving, 50_000, key="kept", session=session)
        session.commit()
    assert count(approving, "SELECT count(*) FROM operations WHERE id = :id", id=dropped.id) == 0
    with pytest.raises(ApprovalNotFound):
        approving.approval(dropped.id)
    assert approving.approval(kept.id).status == "pending"
    assert approving.get(kept.id).waiting_on == 1
