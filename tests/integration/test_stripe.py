"""The Stripe adapter against stripe-stateful-mock, through the fault proxy, on the real
ledger: each fault ends as Stripe's contract says, judged by the mock's own list endpoints
(how many charges and refunds exist, and which carry our operation's marker).

The mock has no PaymentIntents: payments here go through `stripe.charge.v1`, which shares
the adapter's encoding, error mapping, binding and lookup; what a PaymentIntent request
looks like on the wire is checked against a recording loopback server.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl

import pytest
from typer.testing import CliRunner

from opledger.adapters.check import check_contract
from opledger.adapters.defaults import build_registry
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import (
    CHARGE,
    PAYMENT_INTENT,
    REFUND,
    StripeAdapter,
    form,
    stripe_contract,
)
from opledger.cli.main import app as cli
from opledger.dev.faultproxy import FaultProxy
from opledger.ledger import History, Ledger, Operation, Status
from opledger.ledger.evidence import IDEMPOTENCY_MISMATCH
from opledger.ledger.models import EvidenceSource, Verdict
from opledger.settings import Settings, SettingsInvalid, get_settings
from opledger.tasks import steps
from tests.stripemock import API_KEY, StripeMock, stripe_mock

TIMEOUT = timedelta(seconds=0.5)
IN_FLIGHT = timedelta(seconds=1.0)
LEASE = timedelta(seconds=5)
#: an answer held this long is given up on by the adapter (longer than its timeout)
HELD_S = 2.0


def fast_contract(retention: timedelta = timedelta(hours=1)) -> Any:
    return stripe_contract(
        request_timeout=TIMEOUT,
        max_in_flight=IN_FLIGHT,
        retention=retention,
        retention_margin=timedelta(0),
        lookup_lag=timedelta(seconds=0.2),
        lookup_interval=timedelta(seconds=0.2),
    )


@pytest.fixture(scope="module")
def mock() -> Iterator[StripeMock]:
    yield from stripe_mock()


@pytest.fixture
def proxy(mock: StripeMock) -> Iterator[FaultProxy]:
    with FaultProxy(mock.address) as p:
        yield p


class World:
    """A ledger with one Stripe adapter that talks to the mock through the proxy."""

    def __init__(self, ledger: Ledger, proxy: FaultProxy, retention: timedelta) -> None:
        self.adapter = StripeAdapter(
            f"http://127.0.0.1:{proxy.port}", api_key=API_KEY, contract=fast_contract(retention)
        )
        self.registry = Registry([self.adapter])
        self.ledger = Ledger(ledger.engine, actions=self.registry)
        self.ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="t", ref="auth_stripe")

    def prepare(self, action: str, target: str, payload: dict[str, Any]) -> Operation:
        return self.ledger.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"{action}-{target}-{uuid.uuid4().hex[:6]}",
            action=action,
            target=target,
            payload=payload,
            authorization_ref="auth_stripe",
        )

    def dispatch(self, op_id: str, owner: str = "w1") -> steps.StepResult:
        return steps.dispatch(self.ledger, self.registry, op_id, owner=owner, lease=LEASE)

    def settle(self, op_id: str, timeout: float = 20.0) -> History:
        """Reconcile as the sweeper would, until final or held for a person."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            history = self.ledger.history(op_id)
            if history.operation.status.final or history.open_review is not None:
                return history
            wake = history.operation.next_check_at or datetime.now(UTC)
            time.sleep(min(0.5, max(0.0, (wake - datetime.now(UTC)).total_seconds())) + 0.02)
            steps.reconcile(self.ledger, self.registry, op_id, owner="w2", lease=LEASE)
        raise AssertionError(f"{op_id} did not settle: {self.ledger.history(op_id)}")


@pytest.fixture
def world(ledger: Ledger, proxy: FaultProxy) -> Iterator[World]:
    w = World(ledger, proxy, timedelta(hours=1))
    yield w
    w.adapter.close()


def order() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"


def payment(amount: int = 1500, source: str = "tok_visa") -> dict[str, Any]:
    return {"amount": amount, "currency": "usd", "source": source, "metadata": {"cart": "c1"}}


def lookups(history: History) -> list[Verdict]:
    return [e.verdict for e in history.evidence if e.source == EvidenceSource.LOOKUP]


# -- the plain path -------------------------------------------------------------------------


def test_a_charge_is_confirmed_with_its_receipt_and_result(world: World, mock: StripeMock) -> None:
    before = len(mock.charges())
    op = world.prepare(CHARGE, order(), payment())
    world.dispatch(op.id)
    history = world.ledger.history(op.id)
    assert history.operation.status is Status.CONFIRMED
    assert op.marker == op.idempotency_key and op.marker.startswith("opk_")  # not its id
    [charge] = mock.charges(op.marker)
    assert len(mock.charges()) == before + 1
    assert history.operation.provider_result_id == charge["id"]
    assert charge["metadata"] == {
        "cart": "c1",
        "opledger_op": op.marker,
        "opledger_target": op.target,
    }
    [confirmed] = [e for e in history.evidence if e.verdict == Verdict.CONFIRMED]
    assert confirmed.detail["result"] == {
        "id": charge["id"],
        "object": "charge",
        "amount": 1500,
        "currency": "usd",
        "status": "succeeded",
    }
    assert confirmed.binding.target == op.target
    assert confirmed.binding.idempotency_key == op.idempotency_key


def test_a_declined_card_is_rejected_and_nothing_was_charged(
    world: World, mock: StripeMock
) -> None:
    op = world.prepare(CHARGE, order(), payment(source="tok_chargeDeclined"))
    world.dispatch(op.id)
    history = world.ledger.history(op.id)
    assert history.operation.status is Status.REJECTED
    assert mock.charges(op.marker) == []  # no succeeded charge
    assert [c["status"] for c in mock.charges(op.marker, status="")] == ["failed"]
    [attempt] = history.attempts
    assert attempt.response is not None and "card_declined" in json.dumps(attempt.response)


# -- faults ---------------------------------------------------------------------------------


def test_a_response_cut_after_the_charge_is_confirmed_by_the_lookup(
    world: World, mock: StripeMock, proxy: FaultProxy
) -> None:
    before = len(mock.charges())
    proxy.cut_response(after=b"POST /v1/charges", times=1)
    op = world.prepare(CHARGE, order(), payment())
    world.dispatch(op.id)
    assert proxy.fired["cut"] == 1
    assert world.ledger.get(op.id).status is Status.UNKNOWN  # the answer was lost
    assert len(mock.charges(op.marker)) == 1  # ... after Stripe charged
    history = world.settle(op.id)
    assert history.operation.status is Status.CONFIRMED
    assert len(history.attempts) == 1  # found by reading our marker back, not resent
    assert Verdict.CONFIRMED in lookups(history)
    [found] = [e for e in history.evidence if e.verdict == Verdict.CONFIRMED]
    [charge] = mock.charges(op.marker)
    assert found.detail["result"]["id"] == charge["id"] == history.operation.provider_result_id
    assert len(mock.charges()) == before + 1


def test_with_lookups_failing_too_the_same_key_gets_the_stored_answer(
    world: World, mock: StripeMock, proxy: FaultProxy
) -> None:
    before = len(mock.charges())
    proxy.cut_response(after=b"POST /v1/charges", times=1)
    proxy.cut_response(after=b"GET /v1/", times=None)  # every lookup loses its answer
    op = world.prepare(CHARGE, order(), payment())
    world.dispatch(op.id)
    history = world.settle(op.id)
    assert history.operation.status is Status.CONFIRMED
    assert [a.idempotency_key for a in history.attempts] == [op.idempotency_key] * 2
    [confirmed] = [e for e in history.evidence if e.verdict == Verdict.CONFIRMED]
    assert confirmed.source == EvidenceSource.DISPATCH and confirmed.detail["replayed"] is True
    assert len(mock.charges(op.marker)) == 1 and len(mock.charges()) == before + 1


def test_an_answer_delayed_past_the_timeout_is_not_resent_while_in_flight(
    world: World, mock: StripeMock, proxy: FaultProxy
) -> None:
    proxy.delay_response(HELD_S, after=b"POST /v1/charges", times=1)
    op = world.prepare(CHARGE, order(), payment())
    started = time.monotonic()
    world.dispatch(op.id)
    assert time.monotonic() - started < HELD_S  # the adapter gave up before the answer came
    [attempt] = world.ledger.history(op.id).attempts
    assert world.ledger.get(op.id).status is Status.UNKNOWN
    assert attempt.response is not None and attempt.response.get("code") == "timeout"
    history = world.settle(op.id)
    assert history.operation.status is Status.CONFIRMED
    assert len(history.attempts) == 1
    assert len(mock.charges(op.marker)) == 1


def test_a_concurrent_duplicate_dispatch_charges_once(world: World, mock: StripeMock) -> None:
    op = world.prepare(CHARGE, order(), payment())
    results: list[steps.StepResult] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(world.dispatch(op.id, f"w{n}")))
        for n in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.action.value for r in results) == ["dispatched", "noop", "noop", "noop"]
    assert world.ledger.get(op.id).status is Status.CONFIRMED
    assert len(world.ledger.history(op.id).attempts) == 1
    assert len(mock.charges(op.marker)) == 1


def test_two_requests_with_one_key_at_once_make_one_charge(
    world: World, mock: StripeMock, proxy: FaultProxy
) -> None:
    """Below the ledger: the same claim sent twice at once (a stalled worker and its
    successor). Stripe answers the second with 409 idempotency_key_in_use or the stored
    first answer; the mock serializes them, so the second is a replay."""
    op = world.prepare(CHARGE, order(), payment())
    claim = world.ledger.claim(op.id, owner="w1", terms=world.registry.claim_terms(LEASE))
    assert claim is not None
    proxy.delay_response(0.3, times=2)  # both in flight together
    outcomes: list[Any] = [None, None]

    def send(i: int) -> None:
        outcomes[i] = world.adapter.dispatch(claim)

    threads = [threading.Thread(target=send, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kinds = sorted(
        (o.kind, bool(o.detail.get("replayed")), getattr(o, "code", "")) for o in outcomes
    )
    assert kinds in (
        [("confirmed", False, ""), ("confirmed", True, "")],
        [("ambiguous", False, "in_flight"), ("confirmed", False, "")],
    ), kinds
    assert len(mock.charges(op.marker)) == 1


def test_another_body_under_our_key_goes_to_a_person_at_once(
    world: World, mock: StripeMock
) -> None:
    op = world.prepare(CHARGE, order(), payment())
    before = len(mock.charges())
    # someone else's request under our key, other parameters, reaches Stripe first
    foreign = mock.post(
        "/v1/charges",
        {"amount": "999", "currency": "usd", "source": "tok_visa"},
        key=op.idempotency_key,
    )
    assert foreign.status_code == 200
    world.dispatch(op.id)
    history = world.settle(op.id)
    assert history.operation.status is Status.UNKNOWN
    assert history.open_review is not None and "different payload" in history.open_review.reason
    [attempt] = history.attempts
    assert attempt.response is not None and attempt.response.get("code") == IDEMPOTENCY_MISMATCH
    assert mock.charges(op.marker) == []  # ours was never made
    assert len(mock.charges()) == before + 1  # only theirs


@pytest.mark.parametrize("lookups_work", [True, False], ids=["lookup", "no-lookup"])
def test_a_key_past_its_retention_is_never_resent(
    ledger: Ledger, proxy: FaultProxy, mock: StripeMock, lookups_work: bool
) -> None:
    """Retention shorter than the in-flight deadline: by the time a retry could start, the
    key may be pruned and a resend could charge again. Our marker read back still
    confirms; without it, a person decides."""
    w = World(ledger, proxy, retention=timedelta(seconds=1.2))
    try:
        proxy.cut_response(after=b"POST /v1/charges", times=1)
        if not lookups_work:
            proxy.cut_response(after=b"GET /v1/", times=None)
        op = w.prepare(CHARGE, order(), payment())
        w.dispatch(op.id)
        history = w.settle(op.id)
        assert len(history.attempts) == 1  # never resent under a key Stripe may have pruned
        assert len(mock.charges(op.marker)) == 1
        if lookups_work:
            assert history.operation.status is Status.CONFIRMED
        else:
            assert history.operation.status is Status.UNKNOWN
            assert history.open_review is not None
            assert "keeps keys" in history.open_review.reason, history.open_review.reason
    finally:
        w.adapter.close()


def test_a_stored_server_error_is_not_retried_into_a_loop(world: World, mock: StripeMock) -> None:
    """`tok_500` makes the mock answer 500 (and store it under the key, as Stripe does):
    a same-key retry would only replay it, and nothing shows a charge: a person decides."""
    op = world.prepare(CHARGE, order(), payment(source="tok_500"))
    world.dispatch(op.id)
    history = world.settle(op.id)
    assert history.operation.status is Status.UNKNOWN
    assert history.open_review is not None
    assert "server error" in history.open_review.reason, history.open_review.reason
    assert len(history.attempts) == 1
    assert mock.charges(op.marker, status="") == []


def test_a_refund_whose_answer_was_cut_is_confirmed_once(
    world: World, mock: StripeMock, proxy: FaultProxy
) -> None:
    charge = mock.post(
        "/v1/charges", {"amount": "2000", "currency": "usd", "source": "tok_visa"}
    ).json()
    proxy.cut_response(after=b"POST /v1/refunds", times=1)
    op = world.prepare(REFUND, charge["id"], {"amount": 500, "reason": "requested_by_customer"})
    world.dispatch(op.id)
    assert world.ledger.get(op.id).status is Status.UNKNOWN
    history = world.settle(op.id)
    assert history.operation.status is Status.CONFIRMED
    [refund] = mock.refunds(charge=charge["id"])
    assert refund["amount"] == 500 and refund["metadata"] == {"opledger_op": op.marker}
    assert history.operation.provider_result_id == refund["id"]
    assert len(history.attempts) == 1


def test_a_payment_intent_against_the_mock_is_refused_honestly(
    world: World, mock: StripeMock
) -> None:
    """The mock serves no /v1/payment_intents: a 404 before anything executed."""
    op = world.prepare(
        PAYMENT_INTENT, order(), {"amount": 1500, "currency": "usd", "payment_method": "pm_x"}
    )
    world.dispatch(op.id)
    assert world.ledger.get(op.id).status is Status.REJECTED


# -- what goes on the wire (a recording loopback server) ---------------------------------------


class Recorder(ThreadingHTTPServer):
    def __init__(self, answer: dict[str, Any], headers: dict[str, str]) -> None:
        super().__init__(("127.0.0.1", 0), RecordingHandler)
        self.answer, self.headers_out = answer, headers
        self.status = 200
        self.requests: list[tuple[str, dict[str, str], list[tuple[str, str]]]] = []


class RecordingHandler(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        self.server.requests.append(
            (self.path, {k.lower(): v for k, v in self.headers.items()}, parse_qsl(body))
        )
        data = json.dumps(self.server.answer).encode()
        self.send_response(self.server.status)
        for k, v in self.server.headers_out.items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder({}, {})
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@dataclass
class Recorded:
    """A Stripe adapter pointed at the recorder, and a ledger that serves its actions."""

    adapter: StripeAdapter
    ledger: Ledger
    registry: Registry


@pytest.fixture
def recorded(ledger: Ledger, recorder: Recorder) -> Iterator[Recorded]:
    adapter = StripeAdapter(
        f"http://127.0.0.1:{recorder.server_port}", api_key=API_KEY, contract=fast_contract()
    )
    registry = Registry([adapter])
    led = Ledger(ledger.engine, actions=registry)
    led.grant(tenant="acme", scope=["stripe.*"], granted_by="t", ref="auth_stripe")
    try:
        yield Recorded(adapter, led, registry)
    finally:
        adapter.close()


def test_a_payment_intent_request_as_stripe_takes_it(
    recorded: Recorded, recorder: Recorder
) -> None:
    led, registry = recorded.ledger, recorded.registry
    op = led.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="pi",
        action=PAYMENT_INTENT,
        target="invoice-7",
        payload={
            "amount": 4200,
            "currency": "eur",
            "customer": "cus_1",
            "payment_method": "pm_card_visa",
            "description": "Invoice 7",
            "metadata": {"invoice": "7"},
        },
        authorization_ref="auth_stripe",
    )
    recorder.answer = {
        "id": "pi_123",
        "object": "payment_intent",
        "amount": 4200,
        "currency": "eur",
        "status": "succeeded",
        "metadata": {"invoice": "7", "opledger_op": op.marker, "opledger_target": "invoice-7"},
    }
    recorder.headers_out = {"Idempotency-Key": op.idempotency_key, "Request-Id": "req_1"}
    steps.dispatch(led, registry, op.id, owner="w1", lease=LEASE)
    history = led.history(op.id)
    assert history.operation.status is Status.CONFIRMED
    assert history.operation.provider_result_id == "pi_123"
    [(path, headers, params)] = recorder.requests
    assert path == "/v1/payment_intents"
    assert headers["authorization"] == f"Bearer {API_KEY}"
    assert headers["idempotency-key"] == op.idempotency_key
    assert headers["content-type"] == "application/x-www-form-urlencoded"
    assert dict(params) == {
        "amount": "4200",
        "currency": "eur",
        "customer": "cus_1",
        "payment_method": "pm_card_visa",
        "description": "Invoice 7",
        "confirm": "true",
        "automatic_payment_methods[enabled]": "true",
        "automatic_payment_methods[allow_redirects]": "never",
        "metadata[invoice]": "7",
        "metadata[opledger_op]": op.marker,
        "metadata[opledger_target]": "invoice-7",
    }
    [confirmed] = [e for e in history.evidence if e.verdict == Verdict.CONFIRMED]
    assert confirmed.detail["result"]["status"] == "succeeded"
    assert confirmed.detail["request_id"] == "req_1"


def test_an_answer_naming_another_key_or_operation_confirms_nothing(
    recorded: Recorded, recorder: Recorder
) -> None:
    led, registry = recorded.ledger, recorded.registry
    # another operation's marker; the operation's own id (its marker is its first key, not
    # its id); our marker, under another key
    cases: list[tuple[str | None, str | None]] = [
        ("op_someone_else", None),
        ("id", None),
        (None, "other-key"),
    ]
    for n, (marker, echoed) in enumerate(cases):
        op = led.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"k{n}",
            action=CHARGE,
            target="order-x",
            payload=payment(),
            authorization_ref="auth_stripe",
        )
        named = op.id if marker == "id" else marker or op.marker
        recorder.answer = {
            "id": f"ch_{n}",
            "object": "charge",
            "amount": 1500,
            "currency": "usd",
            "status": "succeeded",
            "metadata": {"opledger_op": named, "opledger_target": "order-x"},
        }
        recorder.headers_out = {"Idempotency-Key": echoed} if echoed else {}
        steps.dispatch(led, registry, op.id, owner="w1", lease=LEASE)
        history = led.history(op.id)
        assert history.operation.status is Status.UNKNOWN, history.evidence
        [attempt] = history.attempts
        assert attempt.response is not None
        assert attempt.response.get("code") == "binding_mismatch", attempt.response


def test_form_encoding() -> None:
    assert form({"b": {"y": 2, "x": True}, "a": [1, "z"], "n": None, "c": False}) == [
        ("a[0]", "1"),
        ("a[1]", "z"),
        ("b[x]", "true"),
        ("b[y]", "2"),
        ("c", "false"),
    ]


# -- configuration and the contract check ----------------------------------------------------


def test_registered_only_with_a_key_which_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CHARGE not in build_registry(Settings.from_environ({})).actions
    secret = "sk_test_do_not_show_me_123"
    settings = Settings.from_environ(
        {"OPLEDGER_STRIPE_API_KEY": secret, "OPLEDGER_STRIPE_URL": "http://127.0.0.1:9"}
    )
    assert secret not in repr(settings) and secret not in str(settings.model_dump())
    registry = build_registry(settings)
    try:
        adapter = registry.adapter_for(PAYMENT_INTENT)
        assert set(registry.actions) >= {PAYMENT_INTENT, CHARGE, REFUND}
        contract = adapter.contract
        assert contract.idempotency.retention == timedelta(hours=24)
        assert contract.idempotency.max_key_length == 255
        assert contract.lookup.kind == "search" and contract.lookup.lag == timedelta(minutes=1)
        assert contract.idempotency.scope.startswith("account test account of the key")
        for text in (repr(adapter), contract.model_dump_json(), str(vars(adapter).get("account"))):
            assert secret not in text
        assert Settings.from_environ({}).stripe_url == "https://api.stripe.com"
    finally:
        registry.close()


@pytest.mark.parametrize(
    "written", ["sk_test_secret_with_newline\n", "sk_test_a b", "sk_test_cr\r"]
)
def test_a_key_no_header_can_carry_is_refused_without_being_shown(written: str) -> None:
    """A secret written into the environment with a line break would be quoted back by the
    HTTP client's refusal of the header, into the evidence: refused at the start instead."""
    with pytest.raises(SettingsInvalid) as settings_error:
        Settings.from_environ({"OPLEDGER_STRIPE_API_KEY": written})
    with pytest.raises(ValueError) as adapter_error:
        StripeAdapter("http://127.0.0.1:9", api_key=written)
    for error in (str(settings_error.value), str(adapter_error.value)):
        assert "line break" in error and written.strip() not in error


def test_a_longer_retention_than_stripes_is_refused() -> None:
    with pytest.raises(ValueError, match="prune"):
        stripe_contract(retention=timedelta(hours=25))


def test_the_contract_check_agrees_where_the_mock_shows_it(
    mock: StripeMock, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = StripeAdapter(mock.url, api_key=API_KEY)
    try:
        findings = {f.fact: f for f in check_contract(adapter, adapter.contract_probe)}
    finally:
        adapter.close()
    verdicts = {fact: f.verdict for fact, f in findings.items()}
    assert "disagrees" not in verdicts.values(), findings
    for fact in ("idempotency", "response_binds", "payload_checked", "max_key_length"):
        assert verdicts[fact] == "agrees", findings

    monkeypatch.setenv("OPLEDGER_STRIPE_URL", mock.url)
    monkeypatch.setenv("OPLEDGER_STRIPE_API_KEY", API_KEY)
    monkeypatch.setenv("OPLEDGER_ADAPTERS", "opledger.adapters.defaults:build_registry")
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["contract", "check", CHARGE])
    finally:
        get_settings.cache_clear()
    print(result.output)
    assert result.exit_code == 0, result.output
    assert "no disagreement" in result.output
    assert API_KEY not in result.output


@pytest.mark.parametrize(
    ("status", "error", "headers", "expected"),
    [
        (402, {"type": "card_error", "code": "expired_card"}, {}, ("rejected", "expired_card")),
        (
            400,
            {"type": "invalid_request_error", "code": "amount_too_small"},
            {},
            ("rejected", "amount_too_small"),
        ),
        (400, {"type": "idempotency_error"}, {}, ("ambiguous", "idempotency_mismatch")),
        (
            409,
            {"type": "idempotency_error", "code": "idempotency_key_in_use"},
            {},
            ("ambiguous", "in_flight"),
        ),
        (
            429,
            {"type": "rate_limit_error", "code": "rate_limit"},
            {"Stripe-Should-Retry": "true"},
            ("ambiguous", "throttled"),
        ),
        (
            500,
            {"type": "api_error"},
            {"Idempotent-Replayed": "true"},
            ("ambiguous", "server_error"),
        ),
        (401, {"type": "invalid_request_error"}, {}, ("ambiguous", "http_401")),
    ],
    ids=["decline", "validation", "other-body", "in-use", "rate-limit", "stored-500", "no-key"],
)
def test_stripe_errors_by_type_and_code(
    recorded: Recorded,
    recorder: Recorder,
    status: int,
    error: dict[str, str],
    headers: dict[str, str],
    expected: tuple[str, str],
) -> None:
    adapter, led, registry = recorded.adapter, recorded.ledger, recorded.registry
    op = led.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="e",
        action=CHARGE,
        target="order-e",
        payload=payment(),
        authorization_ref="auth_stripe",
    )
    claim = led.claim(op.id, owner="w1", terms=registry.claim_terms(LEASE))
    assert claim is not None
    recorder.status, recorder.answer, recorder.headers_out = status, {"error": error}, headers
    outcome = adapter.dispatch(claim)
    assert (outcome.kind, getattr(outcome, "code", "")) == expected, outcome
    assert outcome.detail["type"] == error["type"]
    if "Idempotent-Replayed" in headers:
        assert outcome.detail["replayed"] is True
