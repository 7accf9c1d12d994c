"""The worker's steps under a provider's pressure, against the real sandbox CRM enforcing
its own limits and a real ledger: a dispatch waits in its task for room up to its budget,
then leaves the operation for later without a claim; a 429 the provider answers pauses
it and is waited out; a retry refused for room is checked again when room should come."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Binding, Claim, Confirmed, Ledger, Status
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


def test_a_dispatch_waits_for_room_up_to_its_budget_then_defers_without_a_claim(
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
        wait=timedelta(seconds=0.3),
        sleep=slept.append,  # the waits as the step took them (no real sleep needed)
    )
    assert result.action is Step.BUSY
    assert 0.2 <= sum(slept) <= 0.3 and len(slept) >= 4  # polled, within the budget
    op = ledger.get(waiting)
    assert op.status is Status.PREPARED and op.fence == 0  # no claim, no attempt
    assert op.next_check_at is not None  # the relay publishes it again then


def test_room_coming_back_while_it_waits_sends_it_in_the_same_task(
    world: tuple[Ledger, Registry], sandbox: Sandbox
) -> None:
    ledger, registry = world
    holder = ledger.claim(_prepare(ledger, "a"), owner="other", terms=registry.claim_terms(LEASE))
    assert holder is not None
    waiting = _prepare(ledger, "b")
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # the call in flight elsewhere answers: its slot comes back
            ledger.record_outcome(holder, ledger_confirmation(holder))

    result = steps.dispatch(ledger, registry, waiting, owner="w1", lease=LEASE, sleep=sleep)
    assert result.action is Step.DISPATCHED and len(slept) == 3
    assert ledger.get(waiting).status is Status.CONFIRMED
    assert sandbox.effects(f"crm:{key_of(ledger, waiting)}") == 1


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
