"""The worker's steps under a provider's pressure, against the real sandbox CRM enforcing
its own limits and a real ledger: a dispatch whose provider's slots are held leaves the
operation for when the first can free, without a claim or a wait in its task; a call that
answers sooner wakes the oldest waiting operation; room due within the budget is waited for
in the task; a 429 the provider answers pauses it and is waited out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ambiguous, Binding, Claim, Confirmed, Ledger, Status
from opledger.ledger.contract import Limits
from opledger.tasks import steps
from opledger.tasks.steps import Step
from tests.intents import key_of

LEASE = timedelta(seconds=30)
ACCOUNT = "pressed"


@pytest.fixture
def world(ledger: Ledger, sandbox: Sandbox) -> Iterator[tuple[Ledger, Registry]]:
    contract = crm_contract(
        request_timeout=timedelta(seconds=2),
        limits=Limits(concurrency=1, rate=1000, burst=5, throttle_applies_nothing=True),
    )
    registry = Registry([CrmAdapter(sandbox.http_url, account=ACCOUNT, contract=contract)])
    led = Ledger(ledger.engine, actions=registry)
    led.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_p")
    yield led, registry
    registry.close()


def _prepare(ledger: Ledger, key: str) -> str:
    return ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key=key,
        action="crm.close_case.v1",
        target=f"case-{key}",
        payload={"note": "resolved"},
        authorization_ref="auth_p",
    ).id


def test_a_dispatch_whose_slots_are_held_defers_at_once_until_the_first_can_free(
    world: tuple[Ledger, Registry],
) -> None:
    ledger, registry = world
    holder = ledger.claim(_prepare(ledger, "a"), owner="other", terms=registry.claim_terms(LEASE))
    assert holder is not None  # the one slot is taken by a call in flight elsewhere
    waiting = _prepare(ledger, "b")
    slept: list[float] = []
    result = steps.dispatch(
        ledger,
        registry,
        waiting,
        owner="w1",
        lease=LEASE,
        wait=timedelta(seconds=2),
        sleep=slept.append,
    )
    assert result.action is Step.BUSY
    assert slept == []  # no polling in the task: its room is further off than its budget
    op = ledger.get(waiting)
    assert op.status is Status.PREPARED and op.fence == 0  # no claim, no attempt
    # deferred until the slot frees for sure: the holder's in-flight deadline (spread by
    # at most a second), not "try again in 0.05 s"
    assert op.next_check_at is not None
    assert holder.deadline_at <= op.next_check_at <= holder.deadline_at + timedelta(seconds=1.1)


def test_a_call_answering_sooner_wakes_the_oldest_waiting_operation(
    world: tuple[Ledger, Registry], sandbox: Sandbox
) -> None:
    ledger, registry = world
    holder = ledger.claim(_prepare(ledger, "a"), owner="other", terms=registry.claim_terms(LEASE))
    assert holder is not None
    first, second = _prepare(ledger, "b"), _prepare(ledger, "c")
    for op_id in (second, first):  # deferred in the other order: the oldest wakes first
        assert steps.dispatch(ledger, registry, op_id, owner="w1", lease=LEASE).action is Step.BUSY
    woken: list[str] = []
    ledger.record_outcome(holder, ledger_confirmation(holder), wake=woken.append)
    assert woken == [first]  # one slot back: one operation woken, due now
    due = ledger.get(first).next_check_at
    assert due is not None and due <= ledger.get(second).next_check_at  # type: ignore[operator]
    result = steps.dispatch(ledger, registry, first, owner="w1", lease=LEASE)
    assert result.action is Step.DISPATCHED
    assert ledger.get(first).status is Status.CONFIRMED
    assert sandbox.effects(f"crm:{key_of(ledger, first)}") == 1


def test_a_lost_answer_wakes_nobody_and_room_within_the_budget_is_waited_for(
    ledger: Ledger, sandbox: Sandbox
) -> None:
    contract = crm_contract(
        request_timeout=timedelta(seconds=0.4),
        max_in_flight=timedelta(seconds=0.4),
        limits=Limits(concurrency=1),
    )
    registry = Registry([CrmAdapter(sandbox.http_url, account=ACCOUNT, contract=contract)])
    led = Ledger(ledger.engine, actions=registry)
    led.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_p")
    try:
        holder = led.claim(_prepare(led, "a"), owner="other", terms=registry.claim_terms(LEASE))
        assert holder is not None
        woken: list[str] = []
        # the answer was lost: the call may still run there until its deadline, its slot
        # stays taken, and nothing is woken
        led.record_outcome(holder, Ambiguous(code="timeout", reason="lost"), wake=woken.append)
        assert woken == []
        slept: list[float] = []

        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

        waiting = _prepare(led, "b")
        result = steps.dispatch(
            led,
            registry,
            waiting,
            owner="w1",
            lease=LEASE,
            wait=timedelta(seconds=2),
            sleep=sleep,
        )
        # the slot frees within the budget (the deadline under a second away): waited
        # for in the task, once, then sent
        assert result.action is Step.DISPATCHED, result
        assert len(slept) == 1 and slept[0] <= 1.1
        assert led.get(waiting).status is Status.CONFIRMED
    finally:
        registry.close()


def test_a_429_pauses_the_provider_and_the_operation_waits_it_out(
    world: tuple[Ledger, Registry], sandbox: Sandbox
) -> None:
    ledger, registry = world
    sandbox.configure(ACCOUNT, rate_per_s=0.5, burst=1)  # one call, then "not now" for 2 s
    first, second = _prepare(ledger, "a"), _prepare(ledger, "b")
    assert (
        steps.dispatch(ledger, registry, first, owner="w1", lease=LEASE).action is Step.DISPATCHED
    )
    answered = steps.dispatch(ledger, registry, second, owner="w1", lease=LEASE)
    op = answered.operation
    assert op is not None and op.status is Status.UNKNOWN
    history = ledger.history(second)
    (throttled,) = [e for e in history.evidence if e.detail.get("code") == "throttled"]
    assert throttled.detail["retry_after_s"] >= 1
    assert sandbox.effects(f"crm:{key_of(ledger, first)}") == 1
    assert sandbox.effects(f"crm:{key_of(ledger, second)}") == 0  # the 429 applied nothing
    (state,) = ledger.providers()
    assert state.paused and "asked to wait" in (state.pause_reason or "")
    # reconciled at once: the decision waits as long as the provider asked, nobody is asked
    result = steps.reconcile(ledger, registry, second, owner="w1", lease=LEASE)
    assert result.action is Step.WAITING
    assert not ledger.history(second).reviews


def ledger_confirmation(claim: Claim) -> Confirmed:
    return Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))
