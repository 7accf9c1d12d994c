"""The Stripe adapter in real Celery workers, against stripe-stateful-mock behind the fault
proxy: a cut answer, a late answer, a duplicate delivery, another body under our key and a
key past its retention, each settled by the worker, the sweeper and the reconciler, and
counted from the mock's own list endpoints.

The worker runs `tests.system.stripe_registry` (the Stripe adapter with the stack's fast
timings: a 1 s timeout, 2 s in flight, a 1 s lag), configured through OPLEDGER_STRIPE_URL
(the proxy) and OPLEDGER_STRIPE_API_KEY.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from opledger.adapters.registry import load_registry
from opledger.agents import EffectConfirmed, EffectResult, Effects
from opledger.dev.faultproxy import FaultProxy
from opledger.dev.processes import Stack, wait_until
from opledger.ledger import History, Ledger, Operation, Status
from opledger.ledger.models import EvidenceSource, Verdict
from opledger.tasks.app import dispatch
from tests.conftest import truncate_all
from tests.stripemock import API_KEY, StripeMock, stripe_mock

from .conftest import crashes, settings_of, settled, worker_with

pytestmark = [pytest.mark.system, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]
CHARGE, REFUND = "stripe.charge.v1", "stripe.refund.v1"
#: longer than the worker's 1 s request timeout
HELD_S = 3.0
#: Search's lag for the test that shows a lost answer confirmed without waiting for it
LAG_S = 30


@pytest.fixture(scope="module")
def mock() -> Iterator[StripeMock]:
    yield from stripe_mock()


class Rig:
    """A worker whose only adapter is Stripe's, through `proxy`, and a ledger like its."""

    def __init__(
        self, ledger: Ledger, proxy: FaultProxy, mock: StripeMock, env: dict[str, str]
    ) -> None:
        self.ledger, self.proxy, self.mock, self.env = ledger, proxy, mock, env

    def prepare(
        self, action: str, target: str, payload: dict[str, Any], act: str = ""
    ) -> Operation:
        return self.ledger.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"{action}-{target}{act}",
            action=action,
            target=target,
            payload=payload,
            authorization_ref="auth_stripe",
        )

    def settle(self, op: Operation, timeout: float = 40.0) -> History:
        settled(self.ledger, [op.id], timeout)
        return self.ledger.history(op.id)


@contextmanager
def stripe_worker(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock, **env: str
) -> Iterator[Rig]:
    with FaultProxy(mock.address) as proxy:
        env = {
            "OPLEDGER_ADAPTERS": "tests.system.stripe_registry:build_registry",
            "OPLEDGER_STRIPE_URL": f"http://127.0.0.1:{proxy.port}",
            "OPLEDGER_STRIPE_API_KEY": API_KEY,
            "PYTHONPATH": str(REPO),
            **env,
        }
        registry = load_registry(settings_of({**running.env, **env}))
        led = Ledger(ledger.engine, actions=registry)
        led.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_stripe")
        try:
            with worker_with(running, "w1", 2, **env):
                try:
                    yield Rig(led, proxy, mock, env)
                finally:
                    # the plain worker put back serves no Stripe action: an open operation
                    # of one would stop it from starting (its startup check)
                    truncate_all(database_url)
        finally:
            registry.close()


def order() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"


def payment(amount: int = 2500) -> dict[str, Any]:
    return {"amount": amount, "currency": "usd", "source": "tok_visa"}


def lookup_verdicts(history: History) -> list[Verdict]:
    return [e.verdict for e in history.evidence if e.source == EvidenceSource.LOOKUP]


def test_an_answer_cut_after_the_charge_is_confirmed_once(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    """Confirmed from Stripe's list (read-after-write) right after the in-flight deadline,
    without waiting for Search's lag (30 s here)."""
    with stripe_worker(
        running, ledger, database_url, mock, OPLEDGER_SEARCH_LAG_SECONDS=str(LAG_S)
    ) as rig:
        before = len(mock.charges())
        rig.proxy.cut_response(after=b"POST /v1/charges", times=1)
        op = rig.prepare(CHARGE, order(), payment())
        dispatch.delay(op.id)
        history = rig.settle(op)
        assert rig.proxy.fired["cut"] == 1
        assert history.operation.status is Status.CONFIRMED
        assert [a.response.get("code") for a in history.attempts if a.response] == [
            "connection_lost"
        ]
        assert Verdict.CONFIRMED in lookup_verdicts(history)  # our marker, read back
        [found] = [e for e in history.evidence if e.verdict is Verdict.CONFIRMED]
        deadline = history.attempts[0].deadline_at
        assert found.recorded_at - deadline < timedelta(seconds=LAG_S / 2), (found, deadline)
        assert len(mock.charges(op.marker)) == 1 and len(mock.charges()) == before + 1


def test_a_late_answer_is_not_resent_while_in_flight(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    with stripe_worker(running, ledger, database_url, mock) as rig:
        rig.proxy.delay_response(HELD_S, after=b"POST /v1/charges", times=1)
        # lookups lose their answers too: only the same key can settle it
        rig.proxy.cut_response(after=b"GET /v1/", times=None)
        op = rig.prepare(CHARGE, order(), payment())
        dispatch.delay(op.id)
        history = rig.settle(op)
        assert rig.proxy.fired["delay"] == 1
        assert history.operation.status is Status.CONFIRMED
        first, second = history.attempts
        assert first.response is not None and first.response.get("code") == "timeout"
        assert second.started_at >= first.deadline_at  # never while the first could run
        assert second.idempotency_key == first.idempotency_key
        assert second.response is not None
        assert second.response["detail"]["replayed"] is True  # Stripe's stored first answer
        assert len(mock.charges(op.marker)) == 1


def test_a_duplicate_delivery_charges_once(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    with stripe_worker(running, ledger, database_url, mock) as rig:
        rig.proxy.delay_response(0.5, times=None)  # each answer slow: the deliveries overlap
        op = rig.prepare(CHARGE, order(), payment())
        for _ in range(4):
            dispatch.delay(op.id)
        history = rig.settle(op)
        assert history.operation.status is Status.CONFIRMED
        assert len(history.attempts) == 1
        assert len(mock.charges(op.marker)) == 1


def test_another_body_under_our_key_goes_to_a_person(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    with stripe_worker(running, ledger, database_url, mock) as rig:
        op = rig.prepare(CHARGE, order(), payment())
        before = len(mock.charges())
        theirs = mock.post(
            "/v1/charges",
            {"amount": "100", "currency": "usd", "source": "tok_visa"},
            key=op.idempotency_key,
        )
        assert theirs.status_code == 200
        dispatch.delay(op.id)
        history = rig.settle(op)
        assert history.operation.status is Status.UNKNOWN
        assert history.open_review is not None
        assert "different payload" in history.open_review.reason
        assert len(history.attempts) == 1
        assert mock.charges(op.marker) == [] and len(mock.charges()) == before + 1


def test_a_key_past_its_retention_is_not_resent(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    """Keys kept 2 s, less than the attempt's in-flight deadline (3 s): when a retry could
    start, Stripe may have pruned the key, and the list reads fail: a person decides."""
    with stripe_worker(
        running, ledger, database_url, mock, OPLEDGER_KEY_RETENTION_SECONDS="2"
    ) as rig:
        rig.proxy.cut_response(after=b"POST /v1/charges", times=1)
        rig.proxy.cut_response(after=b"GET /v1/", times=None)
        op = rig.prepare(CHARGE, order(), payment())
        dispatch.delay(op.id)
        history = rig.settle(op)
        assert history.operation.status is Status.UNKNOWN
        assert history.open_review is not None
        assert "keeps keys" in history.open_review.reason, history.open_review.reason
        assert len(history.attempts) == 1
        assert len(mock.charges(op.marker)) == 1


def test_a_refund_whose_answer_was_cut_is_refunded_once(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    with stripe_worker(running, ledger, database_url, mock) as rig:
        charge = mock.post(
            "/v1/charges", {"amount": "3000", "currency": "usd", "source": "tok_visa"}
        ).json()
        rig.proxy.cut_response(after=b"POST /v1/refunds", times=1)
        op = rig.prepare(REFUND, charge["id"], {"amount": 1000})
        dispatch.delay(op.id)
        history = rig.settle(op)
        assert rig.proxy.fired["cut"] == 1
        assert history.operation.status is Status.CONFIRMED
        [refund] = mock.refunds(charge=charge["id"])
        assert refund["metadata"]["opledger_op"] == op.marker and refund["amount"] == 1000
        assert history.operation.provider_result_id == refund["id"]

        # more than is left, its answer cut: the same key sent again gets Stripe's stored
        # refusal of the first request, replayed: the first attempt's own, so a rejection
        rig.proxy.close_connections()  # the worker's next request on a new one, cut
        rig.proxy.cut_response(after=b"POST /v1/refunds", times=1)
        too_much = rig.prepare(REFUND, charge["id"], {"amount": 5000}, act="-too-much")
        dispatch.delay(too_much.id)
        refused = rig.settle(too_much)
        assert refused.operation.status is Status.REJECTED, refused.open_review
        first, second = refused.attempts
        assert first.response is not None and first.response.get("code") == "connection_lost"
        assert second.response is not None and second.response["detail"]["replayed"] is True
        assert second.idempotency_key == first.idempotency_key
        assert rig.proxy.fired["cut"] == 2
        assert len(mock.refunds(charge=charge["id"])) == 1  # the first refund only


def test_a_worker_killed_after_stripe_answered_is_reconciled_not_recharged(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    """Crash window 2: Stripe charged and answered, the worker process was SIGKILLed before
    it saved the outcome. The sweeper takes the operation over after the lease and the
    reconciler finds the charge by our marker."""
    with stripe_worker(running, ledger, database_url, mock) as rig:
        running.kill_worker("w1")
        crashy = running.start_worker(
            "crashy", 1, **rig.env, OPLEDGER_CRASHPOINT="dispatch.after_call"
        )
        op = rig.prepare(CHARGE, order(), payment())
        dispatch.delay(op.id)
        wait_until(lambda: crashes(crashy) >= 1, 60, "the crash after Stripe answered")
        assert len(mock.charges(op.marker)) == 1  # charged; the answer died with the process
        running.kill_worker("crashy")
        running.start_worker("w1", 2, **rig.env)
        history = rig.settle(op)
        assert history.operation.status is Status.CONFIRMED
        assert len(history.attempts) == 1
        assert Verdict.CONFIRMED in lookup_verdicts(history)
        assert len(mock.charges(op.marker)) == 1


def test_two_runs_asking_the_same_refund_of_one_charge_refund_it_once(
    running: Stack, ledger: Ledger, database_url: str, mock: StripeMock
) -> None:
    """A refund is the tenant's act (`stripe.refund.v1`'s intent scope): two agent runs
    asking at once to refund the same charge the same amount for the same reason get one
    operation, refunded once at Stripe, and both are answered with it."""
    with stripe_worker(running, ledger, database_url, mock) as rig:
        charge = mock.post(
            "/v1/charges", {"amount": "3000", "currency": "usd", "source": "tok_visa"}
        ).json()
        effects = Effects(rig.ledger, publish=lambda op_id: dispatch.delay(op_id))

        def ask(run: str) -> EffectResult:
            return effects.effect(
                tenant="acme",
                run=run,
                action=REFUND,
                target=charge["id"],
                payload={"amount": 1000, "reason": "requested_by_customer"},
                authorization_ref="auth_stripe",
                asked_by=f"{run}:call_1",
                wait=30,
            )

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(ask, ["langgraph:ticket-7", "langgraph:ticket-7-replanned"]))
        refunds = mock.refunds(charge=charge["id"])
        assert len(refunds) == 1, refunds  # Stripe's own count
        first, second = sorted(answers, key=lambda a: a.asked_before)
        assert isinstance(first, EffectConfirmed) and isinstance(second, EffectConfirmed), answers
        assert first.op_id == second.op_id and (first.asked_before, second.asked_before) == (
            False,
            True,
        )
        assert second.first_asked_in == first.operation.workflow_id
        [refund] = refunds
        assert refund["amount"] == 1000 and refund["metadata"]["opledger_op"] == (
            first.operation.marker
        )
        assert first.receipt_id == second.receipt_id == refund["id"]
        assert len(rig.ledger.history(first.op_id).attempts) == 1
