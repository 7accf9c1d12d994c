"""What an agent is told about an act held for a person's approval, on a real Postgres: a
wait returns at once (a person holds it) with a pending answer that says approval, who
must give it, since when and why — never "a worker to take it"; asked again it is the same
answer, never a second request; approved, it waits for a worker; denied, it is cancelled
with the reason the model reads."""

from __future__ import annotations

import pytest

from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.agents import EffectCancelled, EffectPending, Effects
from opledger.agents.answers import summary
from opledger.console.accounts import Accounts
from opledger.ledger import Ledger

REFUND = "stripe.refund.v1"


@pytest.fixture
def held(ledger: Ledger) -> Ledger:
    """Refunds above 10000 need one person's approval; alice approves Stripe's acts."""
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval(REFUND, {"when": [{"field": "amount", "above": 10000}]})
    ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_s")
    Accounts(ledger.engine).add(
        "alice", tenants=["acme"], password=None, by="test", approves=["stripe.*"]
    )
    return Ledger(ledger.engine, actions=registry)


def _refund(
    effects: Effects, amount: int, call: str, wait: float = 30
) -> EffectPending | EffectCancelled:
    result = effects.effect(
        tenant="acme",
        run="run-1",
        action=REFUND,
        target="ch_1",
        payload={"amount": amount, "reason": "duplicate"},
        authorization_ref="auth_s",
        asked_by=call,
        wait=wait,  # a person holds it: answered at once, never after the whole wait
    )
    assert isinstance(result, EffectPending | EffectCancelled), result
    return result


def test_an_act_held_for_approval_is_answered_at_once_and_says_so(held: Ledger) -> None:
    published: list[str] = []
    effects = Effects(held, publish=published.append, poll=30.0)
    first = _refund(effects, 25000, "call-1")
    assert isinstance(first, EffectPending) and first.awaiting == "approval"
    assert "approval by a person" in first.waiting_for
    assert "amount" in first.waiting_for  # why the policy asks
    assert "worker" not in first.waiting_for
    told = summary(first)
    assert (told["kind"], told["awaiting"]) == ("pending", "approval")
    assert "approval" in told["message"]
    again = _refund(effects, 25000, "call-2")  # the model asked again under a new id
    assert (again.op_id, again.asked_before) == (first.op_id, True)
    assert isinstance(again, EffectPending) and again.awaiting == "approval"
    assert len(held.approvals(tenant="acme")) == 1 and published == []

    approval = held.approval(first.op_id)
    held.approve(first.op_id, operator="alice", digest=approval.payload_digest)
    after = effects.result(first.op_id)
    assert isinstance(after, EffectPending) and after.awaiting == "worker"
    # a retry of the whole tool call, made from scratch in a new process (Temporal's
    # activity retry): the approved operation, never a new approval request
    anew = Effects(held, publish=published.append, poll=30.0)
    retried = _refund(anew, 25000, "call-3", wait=0.2)  # no worker here: it stays pending
    assert (retried.op_id, retried.asked_before) == (first.op_id, True)
    assert isinstance(retried, EffectPending) and retried.awaiting == "worker"
    assert len(held.approvals(tenant="acme", status=None)) == 1


def test_a_denied_act_is_cancelled_with_the_reason_the_model_reads(held: Ledger) -> None:
    effects = Effects(held, publish=lambda op_id: None, poll=30.0)
    first = _refund(effects, 25000, "call-1")
    approval = held.approval(first.op_id)
    held.deny(first.op_id, operator="alice", digest=approval.payload_digest, note="wrong customer")
    denied = _refund(effects, 25000, "call-2")
    assert isinstance(denied, EffectCancelled) and denied.asked_before
    assert "denied by alice" in denied.reason and "wrong customer" in denied.reason
    assert "denied by alice" in summary(denied)["message"]


def test_an_act_under_the_threshold_is_not_held(held: Ledger) -> None:
    published: list[str] = []
    effects = Effects(held, publish=published.append, poll=30.0)
    result = effects.effect(
        tenant="acme",
        run="run-1",
        action=REFUND,
        target="ch_2",
        payload={"amount": 500, "reason": "duplicate"},
        authorization_ref="auth_s",
    )
    assert isinstance(result, EffectPending) and result.awaiting == "worker"
    assert published == [result.op_id] and held.approvals(tenant="acme") == ()
