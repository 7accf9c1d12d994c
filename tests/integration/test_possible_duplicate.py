"""A provider that forgot our key between an attempt whose answer was lost and the resend
charges again and answers a fresh success: the worker confirms the operation and opens a
review of a possible duplicate in the same outcome statement, on the in-memory twin and on
Postgres alike; that review is resolved as acknowledged (the operation stays confirmed, the
audit keeps who and why), never as confirmed, rejected, retry or cancel; and it is counted,
listed and notified like any review."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opledger.adapters.base import LookupResult
from opledger.adapters.registry import Registry
from opledger.dev.memory import FakeClock, MemoryLedger
from opledger.ledger import (
    Ambiguous,
    Binding,
    Claim,
    Confirmed,
    Ledger,
    Operation,
    Outcome,
    Resolution,
    Status,
)
from opledger.ledger.contract import Contract, Idempotency, Lookup
from opledger.ledger.errors import ResolutionNotAllowed
from opledger.ledger.evidence import POSSIBLE_DUPLICATE
from opledger.ledger.facades import WorkerLedger
from opledger.ledger.models import Verdict
from opledger.observability.ledger_gauges import LedgerCollector
from opledger.tasks.worker import FollowUps, Step, Worker, WorkerConfig

ACTION = "pay.charge.v1"
#: past every in-flight deadline of the first attempt (send window + in flight)
LATER = timedelta(minutes=5)


class ForgetfulPay:
    """A payment API that keys requests, marks every replay and loses its keys on a
    restart (its durable-keys promise broken): `cut` charges and loses the answer."""

    actions: tuple[str, ...] = (ACTION,)

    def __init__(self) -> None:
        self.contract = Contract(
            provider="pay",
            effect="payment",
            idempotency=Idempotency(
                kind="keyed",
                scope="account",
                retention=timedelta(hours=24),
                after_error="replayed",
                keys_durable=True,
                payload_checked=True,
                concurrent="conflict",
                marks_replays=True,
            ),
            lookup=Lookup(kind="none"),
            response_binds="key",
            request_timeout=timedelta(seconds=1),
            max_in_flight=timedelta(seconds=2),
        )
        self.keys: dict[str, str] = {}
        self.charges: list[str] = []
        self.cut = False

    def dispatch(self, claim: Claim) -> Outcome:
        key = claim.idempotency_key
        binding = Binding(idempotency_key=key, target=claim.operation.target)
        if key in self.keys:
            return Confirmed(receipt_id=self.keys[key], binding=binding, detail={"replayed": True})
        charge = f"ch_{len(self.charges) + 1}"
        self.charges.append(charge)
        self.keys[key] = charge
        if self.cut:
            self.cut = False
            return Ambiguous(code="connection_lost", reason="the answer was lost after sending")
        return Confirmed(receipt_id=charge, binding=binding, detail={"replayed": False})

    def lookup(self, operation: Operation, attempts: Any) -> LookupResult:
        return LookupResult(verdict=Verdict.INCONCLUSIVE)

    def restart(self) -> None:
        self.keys.clear()


def _charge_twice(
    ledger: WorkerLedger, clock: Callable[[], datetime], advance: Callable[[], None], lose: bool
) -> tuple[ForgetfulPay, str, list[str], Worker]:
    """A charge whose answer is lost, the provider restarted (`lose`) or not, and the
    retry after the in-flight deadline; the provider, the operation and the reviews the
    worker asked to notify."""
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
        intent_key="charge-order-7",
        action=ACTION,
        target="order-7",
        payload={"amount": 2500},
        authorization_ref=grant,
    )
    pay.cut = True
    assert worker.dispatch(op.id).operation.status is Status.UNKNOWN  # type: ignore[union-attr]
    if lose:
        pay.restart()
    advance()
    done = worker.reconcile(op.id)
    assert done.action is Step.DISPATCHED, done
    return pay, op.id, opened, worker


def _memory() -> tuple[MemoryLedger, Callable[[], datetime], Callable[[], None]]:
    clock = FakeClock(datetime.now(UTC))
    return MemoryLedger(clock=clock), clock, lambda: clock.advance(LATER)


def _postgres(ledger: Ledger) -> tuple[Ledger, Callable[[], datetime], Callable[[], None]]:
    shift = [timedelta(0)]

    def advance() -> None:
        shift[0] = LATER

    return (
        Ledger(ledger.engine, actions=Registry([ForgetfulPay()])),
        lambda: datetime.now(UTC) + shift[0],
        advance,
    )


@pytest.fixture(params=["memory", "postgres"])
def on(request: pytest.FixtureRequest) -> tuple[Any, Callable[[], datetime], Callable[[], None]]:
    if request.param == "memory":
        return _memory()
    return _postgres(request.getfixturevalue("ledger"))


def test_a_fresh_success_after_a_restart_confirms_and_opens_a_review_of_a_possible_duplicate(
    on: tuple[Any, Callable[[], datetime], Callable[[], None]],
) -> None:
    ledger, clock, advance = on
    pay, op_id, opened, _ = _charge_twice(ledger, clock, advance, lose=True)
    history = ledger.history(op_id)
    assert pay.charges == ["ch_1", "ch_2"]  # the provider did charge twice
    assert history.operation.status is Status.CONFIRMED
    assert history.operation.provider_result_id == "ch_2"
    review = history.open_review
    assert review is not None and review.reason.startswith(POSSIBLE_DUPLICATE), review
    assert "may have applied the payment twice" in review.reason
    assert opened == [op_id]  # notified like any review
    snap = review.snapshot
    assert snap["kind"] == POSSIBLE_DUPLICATE
    assert snap["fresh_success"]["attempt"] == 2
    assert snap["fresh_success"]["outcome"]["receipt_id"] == "ch_2"
    [earlier] = snap["earlier_attempts"]
    assert earlier["n"] == 1
    assert earlier["response"]["code"] == "connection_lost"
    assert [e["verdict"] for e in earlier["evidence"]] == ["ambiguous"]
    assert "undo it" in snap["what_it_could_mean"]
    # the confirming evidence says so itself (an agent's answer reads it)
    confirming = [e for e in history.evidence if e.verdict is Verdict.CONFIRMED]
    assert [e.detail.get(POSSIBLE_DUPLICATE) for e in confirming] == [
        {"attempts": [1], "key": history.operation.idempotency_key}
    ]


def test_a_replay_after_the_lost_answer_confirms_without_a_review(
    on: tuple[Any, Callable[[], datetime], Callable[[], None]],
) -> None:
    ledger, clock, advance = on
    pay, op_id, opened, _ = _charge_twice(ledger, clock, advance, lose=False)
    history = ledger.history(op_id)
    assert pay.charges == ["ch_1"]
    assert history.operation.status is Status.CONFIRMED
    assert history.open_review is None and opened == []


def test_the_review_of_a_possible_duplicate_is_notified_on_the_twin() -> None:
    ledger, clock, advance = _memory()
    _, op_id, _, worker = _charge_twice(ledger, clock, advance, lose=True)
    worker.config = WorkerConfig(review_webhook_url="http://127.0.0.1:9/hook")
    assert worker.notify_review(op_id) == "prepared"


def test_a_possible_duplicate_is_acknowledged_and_nothing_else(ledger: Ledger) -> None:
    led, clock, advance = _postgres(ledger)
    _, op_id, _, _ = _charge_twice(led, clock, advance, lose=True)
    reviews = led.reviews
    [listed] = reviews.list(tenant="acme", reason=POSSIBLE_DUPLICATE)
    assert listed.op_id == op_id
    assert [c.n for c in reviews.counts(tenant="acme")] == [1]
    gauges = {m.name: m.samples[0].value for m in LedgerCollector(led.engine).collect()}
    assert gauges["opledger_reviews_open"] == 1

    view = reviews.show(op_id, tenant="acme", operator="ana")
    assert view.operation.status is Status.CONFIRMED
    assert view.consequences is None  # no resolution moves it: none has consequences
    for refused in ("confirmed", "rejected", "retry", "cancel"):
        with pytest.raises(ResolutionNotAllowed, match="Resolve it as acknowledged"):
            reviews.resolve(op_id, tenant="acme", operator="ana", resolution=refused, note="x")
    after = reviews.resolve(
        op_id,
        tenant="acme",
        operator="ana",
        resolution="acknowledged",
        note="two charges found; refunded ch_1 by hand",
    )
    assert after.status is Status.CONFIRMED and after.fence == view.operation.fence
    history = led.history(op_id)
    assert history.open_review is None
    assert history.reviews[-1].resolution == "acknowledged"
    assert history.reviews[-1].resolved_by == "ana"
    [audit] = reviews.audit(op_id, tenant="acme")
    assert audit.resolution is Resolution.ACKNOWLEDGED
    assert (audit.operator, audit.note) == ("ana", "two charges found; refunded ch_1 by hand")
    assert audit.shown["status"] == "confirmed"
    assert not [e for e in history.evidence if e.source.value == "operator"]  # no verdict
    gauges = {m.name: m.samples[0].value for m in LedgerCollector(led.engine).collect()}
    assert gauges["opledger_reviews_open"] == 0


def test_an_unknown_operations_review_is_never_just_acknowledged(ledger: Ledger) -> None:
    led = Ledger(ledger.engine, actions=Registry([ForgetfulPay()]))
    led.grant(tenant="acme", scope=["pay.*"], granted_by="t", ref="auth_pay")
    op = led.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="charge-order-8",
        action=ACTION,
        target="order-8",
        payload={"amount": 2500},
        authorization_ref="auth_pay",
    )
    claim = led.claim(op.id, owner="w")
    assert claim is not None
    lost = led.record_outcome(claim, Ambiguous(code="connection_lost", reason="lost"))
    led.open_review(op.id, fence=lost.fence, reason="nothing can tell")
    led.reviews.show(op.id, tenant="acme", operator="ana")
    with pytest.raises(ResolutionNotAllowed, match="needs confirmed, rejected, retry or cancel"):
        led.reviews.resolve(
            op.id, tenant="acme", operator="ana", resolution="acknowledged", note="x"
        )
    assert led.get(op.id).status is Status.UNKNOWN


def test_the_cli_lists_shows_and_acknowledges_a_possible_duplicate(
    ledger: Ledger, invoke: Callable[..., Any]
) -> None:
    led, clock, advance = _postgres(ledger)
    _, op_id, _, _ = _charge_twice(led, clock, advance, lose=True)
    (listed,) = invoke(
        "review", "list", "--tenant", "acme", "--reason", POSSIBLE_DUPLICATE, "--json"
    ).json()
    assert listed["op_id"] == op_id
    none = invoke("review", "list", "--tenant", "acme", "--reason", "nothing like it", "--json")
    assert none.json() == []
    shown = invoke("review", "show", op_id, "--tenant", "acme", "--operator", "ana")
    assert shown.code == 0 and "acknowledged" in shown.out
    base = ("review", "resolve", op_id, "--tenant", "acme", "--operator", "ana", "--note", "x")
    refused = invoke(*base, "--as", "retry")
    assert refused.code == 3 and "acknowledged" in refused.err, refused
    done = invoke(*base, "--as", "acknowledged")
    assert done.code == 0 and f"acknowledged; {op_id} stays confirmed" in done.out, done
