"""The adapters' error mapping, branch by branch (what `make mutate` asks of base.py).

What the mapping promises (base.py docstrings, and the numbered retry rules of docs/rules.md):
a client error is never a refusal, and only a connection never
made proves nothing was sent; an HTTP error is read by the provider's error code first, then by its
status, and every outcome keeps the provider's answer for the record; a 5xx is never a refusal.
Kept-alive connections are used only where a same-key retry is protected.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from opledger.adapters.base import (
    ErrorCodes,
    WindowedTransport,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
    sending,
)
from opledger.adapters.crm import crm_contract
from opledger.ledger import Ambiguous, Rejected, SendWindow, SendWindowPassed
from opledger.ledger.contract import Contract, Idempotency
from opledger.ledger.contract import Lookup as LookupSpec
from opledger.ledger.decide import NeedsReview, decide
from opledger.ledger.evidence import IN_FLIGHT, NOT_SENT, SERVER_ERROR
from opledger.ledger.risk import same_key_retry_risk
from opledger.ledger.window import clock

from .histories import OP_ID, T0, attempt, evidence, grant, operation

S = timedelta(seconds=1)
REQUEST = httpx.Request("POST", "http://127.0.0.1/")
CODES = ErrorCodes(
    definitive=frozenset({"case_not_found"}),
    conflicting_state=frozenset({"case_already_closed"}),
    in_flight=frozenset({"key_in_use"}),
    mismatch=frozenset({"key_reused"}),
    poisoned=frozenset({"key_failed"}),
)


def _json(status: int, body: object, *, replayed: bool = False) -> httpx.Response:
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return httpx.Response(status, json=body, headers=headers)


def _text(status: int, text: str) -> httpx.Response:
    return httpx.Response(status, text=text, headers={"Content-Type": "text/plain"})


def _map(response: httpx.Response) -> Ambiguous | Rejected:
    return outcome_for_http_status(response, CODES, provider="the CRM")


def refusal(call: Callable[[], object]) -> Exception:
    with pytest.raises(Exception) as info:
        call()
    return info.value


# -- client errors: never a refusal; "not sent" only where no connection was made -----------


def test_a_passed_send_window_is_not_sent_and_says_why_like_the_worker_records_it() -> None:
    exc = SendWindowPassed("the send-by window of op_x passed 0.200 s ago: nothing was sent")
    outcome = outcome_for_http_error(exc)
    assert outcome.code == NOT_SENT
    assert outcome.detail == {"why": "window_passed"}  # the worker's own record of it
    assert outcome.reason == str(exc)


CLIENT_ERRORS = [
    (httpx.ConnectError("refused", request=REQUEST), NOT_SENT),
    (httpx.ConnectTimeout("no answer", request=REQUEST), NOT_SENT),
    (httpx.PoolTimeout("no free connection", request=REQUEST), NOT_SENT),
    (httpx.ReadTimeout("slow", request=REQUEST), "timeout"),
    (httpx.WriteTimeout("slow", request=REQUEST), "timeout"),
    (TimeoutError("slow"), "timeout"),
    (httpx.ReadError("reset", request=REQUEST), "connection_lost"),
    (httpx.WriteError("pipe", request=REQUEST), "connection_lost"),
    (httpx.RemoteProtocolError("peer closed", request=REQUEST), "connection_lost"),
    (BrokenPipeError("pipe"), "connection_lost"),
    (httpx.TooManyRedirects("loop", request=REQUEST), "http_error"),
    (httpx.DecodingError("gzip", request=REQUEST), "http_error"),
    (httpx.LocalProtocolError("bad header", request=REQUEST), "http_error"),
    (httpx.CloseError("close", request=REQUEST), "http_error"),
    (httpx.InvalidURL("no host"), "http_error"),
    (httpx.CookieConflict("two"), "http_error"),
    (httpx.StreamConsumed(), "stream_error"),
    (httpx.ResponseNotRead(), "stream_error"),
    (json.JSONDecodeError("not json", "<html>", 0), "unreadable_response"),
    (RuntimeError("a bug"), "client_error"),
    (KeyError("case_id"), "client_error"),
]


@pytest.mark.parametrize(
    ("exc", "code"), CLIENT_ERRORS, ids=[type(e).__name__ for e, _ in CLIENT_ERRORS]
)
def test_each_kind_of_client_error_gets_its_own_ambiguous_code(exc: Exception, code: str) -> None:
    outcome = outcome_for_http_error(exc)
    assert isinstance(outcome, Ambiguous)
    assert outcome.code == code
    assert type(exc).__name__ in outcome.reason  # the reason says what was raised


@pytest.mark.parametrize(
    "exc",
    [
        SendWindowPassed("w" * 2000),
        httpx.ConnectError("c" * 2000, request=REQUEST),
        httpx.ReadTimeout("t" * 2000, request=REQUEST),
        RuntimeError("r" * 2000),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_client_error_reason_is_kept_to_500_characters(exc: Exception) -> None:
    reason = outcome_for_http_error(exc).reason
    assert 400 < len(reason) <= 500


# -- HTTP errors: the provider's code first, then the status -----------------------------------


@pytest.mark.parametrize(
    ("response", "detail"),
    [
        (_json(409, {"error": {"code": "key_in_use"}}), (409, "key_in_use", False)),
        (_json(422, {"error": {"code": "key_reused"}}, replayed=True), (422, "key_reused", True)),
        (_json(422, {"error": {"code": "key_failed"}}), (422, "key_failed", False)),
        (
            _json(404, {"error": {"code": "case_not_found"}}, replayed=True),
            (404, "case_not_found", True),
        ),
        (
            _json(409, {"error": {"code": "case_already_closed"}}),
            (409, "case_already_closed", False),
        ),
        (_json(422, {"message": "case is closed"}), (422, "", False)),
        (_json(503, {"message": "oops"}, replayed=True), (503, "", True)),
        (_json(408, {"error": {"code": "slow_down"}}), (408, "slow_down", False)),
    ],
    ids=[
        "in_flight",
        "mismatch",
        "poisoned",
        "definitive",
        "conflicting",
        "bare 4xx",
        "5xx",
        "408",
    ],
)
def test_every_http_outcome_keeps_the_status_the_providers_code_and_whether_it_was_replayed(
    response: httpx.Response, detail: tuple[int, str, bool]
) -> None:
    status, code, replayed = detail
    outcome = _map(response)
    assert outcome.detail == {"status": status, "code": code, "replayed": replayed}


@pytest.mark.parametrize(
    ("code", "cause"),
    [("key_in_use", "executing"), ("key_reused", "another payload"), ("key_failed", "replacing")],
)
def test_a_key_answer_says_what_became_of_the_key(code: str, cause: str) -> None:
    outcome = _map(_json(409, {"error": {"code": code}}))
    assert isinstance(outcome, Ambiguous) and cause in outcome.reason


@pytest.mark.parametrize("status", [500, 502, 503, 599])
@pytest.mark.parametrize("code", ["case_not_found", "case_already_closed", ""])
def test_a_5xx_is_never_a_refusal_whatever_code_it_carries(status: int, code: str) -> None:
    outcome = _map(_json(status, {"error": {"code": code}} if code else {}))
    assert isinstance(outcome, Ambiguous) and outcome.code == SERVER_ERROR


@pytest.mark.parametrize("status", [400, 409, 412, 418, 428])
def test_a_conflicting_state_code_is_a_conflicting_refusal_under_any_4xx(status: int) -> None:
    outcome = _map(_json(status, {"error": {"code": "case_already_closed"}}))
    assert isinstance(outcome, Rejected)
    assert (outcome.code, outcome.conflicting_state) == ("case_already_closed", True)


@pytest.mark.parametrize("status", [401, 402, 408, 412, 425])
def test_an_unknown_code_outside_the_refusal_statuses_stays_ambiguous(status: int) -> None:
    outcome = _map(_json(status, {"error": {"code": "slow_down"}}))
    assert isinstance(outcome, Ambiguous) and outcome.code == "slow_down"


def test_a_flat_error_body_is_read_like_a_nested_one() -> None:
    outcome = _map(_json(404, {"code": "case_not_found", "message": "no case 318"}))
    assert isinstance(outcome, Rejected)
    assert (outcome.code, outcome.conflicting_state) == ("case_not_found", False)
    busy = _map(_json(409, {"code": "key_in_use"}))
    assert isinstance(busy, Ambiguous) and busy.code == IN_FLIGHT


@pytest.mark.parametrize(
    ("response", "says"),
    [
        # the provider's code, when it gives one
        (
            _json(409, {"error": {"code": "case_already_closed", "message": "Closed."}}),
            "case_already_closed",
        ),
        (_json(412, {"error": {"code": "case_already_closed"}}), "case_already_closed"),
        # else its message, from either shape of error body or a plain-text body
        (_json(422, {"message": "case is closed"}), "case is closed"),
        (_json(422, {"error": {"message": "case is closed"}}), "case is closed"),
        (_text(409, "Case 318 is already closed"), "Case 318 is already closed"),
        # else the status
        (_json(409, {}), "409"),
        (_json(409, {"error": {"type": "conflict"}}), "409"),
        (_json(400, ["not", "an", "object"]), "400"),
        (_json(400, "just a string"), "400"),
    ],
    ids=[
        "code and message",
        "code",
        "flat message",
        "nested message",
        "plain text",
        "empty object",
        "error without message",
        "json array",
        "json string",
    ],
)
def test_a_refusal_says_the_code_else_the_message_else_the_status(
    response: httpx.Response, says: str
) -> None:
    outcome = _map(response)
    assert isinstance(outcome, Rejected)
    assert says in outcome.reason
    if says.isdigit():  # no code in the body: the status stands in for it
        assert outcome.code == f"http_{says}"


@pytest.mark.parametrize("status", [402, 408, 429, 451])
def test_a_replayed_error_that_is_no_refusal_is_marked_replayed(status: int) -> None:
    """Rule 5: a stored error the provider replays for our key is no new information, so
    the outcome must say it was replayed (the ledger records `Ambiguous.replayed`)."""
    replay = _map(_json(status, {"error": {"code": "card_declined"}}, replayed=True))
    assert isinstance(replay, Ambiguous) and replay.replayed
    fresh = _map(_json(status, {"error": {"code": "card_declined"}}))
    assert isinstance(fresh, Ambiguous) and not fresh.replayed
    # what the decision makes of it, recorded as the ledger records an outcome's detail
    recorded = {**replay.detail, "code": replay.code, "replayed": replay.replayed}
    ev = evidence("ambiguous", source="dispatch", attempt_n=1, **recorded)
    atomic = keyed(after_error="nothing_applied", keys_durable=True)
    decision = decide(atomic, operation(), [attempt()], [ev], grant(), T0 + 60 * S)
    assert (
        isinstance(decision, NeedsReview)
        and "replays what it stored for this key" in decision.reason
    )


def test_a_refusal_reason_is_kept_to_500_characters() -> None:
    outcome = _map(_json(422, {"message": "m" * 2000}))
    assert isinstance(outcome, Rejected) and len(outcome.reason) <= 500


def test_a_body_without_a_code_never_invents_one() -> None:
    for response in (
        _json(409, {"error": {"message": "in use"}}),
        _json(409, {"message": "in use"}),
        _json(409, [1, 2]),
        _text(409, "in use"),
        httpx.Response(409),
    ):
        assert _map(response).code == "http_409"


# -- kept-alive connections only where a same-key retry is protected -------------------------


def keyed(**facts: Any) -> Contract:
    return crm_contract(request_timeout=10 * S, max_in_flight=20 * S, lookup="none", **facts)


def no_dedup() -> Contract:
    return Contract(
        provider="p",
        idempotency=Idempotency(kind="none"),
        lookup=LookupSpec(kind="none"),
        request_timeout=10 * S,
        max_in_flight=20 * S,
    )


CONTRACTS = [no_dedup()] + [
    keyed(after_error=after, keys_durable=durable)
    for after in ("replayed", "nothing_applied", "rerun_failed", "key_released")
    for durable in (True, False)
]


@pytest.mark.parametrize(
    "contract",
    CONTRACTS,
    ids=lambda c: f"{c.idempotency.kind}-{c.idempotency.after_error}-{c.idempotency.keys_durable}",
)
def test_connections_are_reused_exactly_where_a_lost_one_costs_no_review(
    contract: Contract,
) -> None:
    idem = contract.idempotency
    expected = idem.kind == "keyed" and idem.keys_durable and idem.after_error != "key_released"
    assert reuses_connections(contract) is expected
    # the same answer as the decision's: after a lost connection, may the same key go again?
    lost = evidence("ambiguous", source="dispatch", attempt_n=1, code="connection_lost")
    risk = same_key_retry_risk(contract, operation(), [attempt()], [lost], T0 + 60 * S)
    assert reuses_connections(contract) is (risk is None)


# -- the key scope an adapter sends into -------------------------------------------------------


def test_the_scope_names_where_the_adapter_sends_unless_it_already_does() -> None:
    contract = keyed(scope="account acme")
    concrete = scoped(contract, "crm.example/acme")
    assert concrete.idempotency.scope == "account acme crm.example/acme"
    assert concrete.model_copy(update={"idempotency": contract.idempotency}) == contract
    assert scoped(concrete, "crm.example/acme") == concrete
    assert scoped(keyed(scope=""), "crm.example/acme").idempotency.scope == "crm.example/acme"
    assert scoped(no_dedup(), "crm.example/acme") == no_dedup()


# -- the shared client: no retries or redirects of its own, and the window at the wire ----------


def _window(seconds: float) -> SendWindow:
    return SendWindow(op_id=OP_ID, send_by=T0, length=timedelta(seconds=seconds), opened=clock())


class _Wire(httpx.BaseTransport):
    """Stands in for httpcore: reports the trace events a real request goes through."""

    def __init__(self) -> None:
        self.closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        trace = request.extensions.get("trace")
        for event in (
            "connection.connect_tcp.started",
            "connection.connect_tcp.complete",
            "http11.send_request_headers.started",
            "http11.send_request_headers.complete",
        ):
            if trace is not None:
                trace(event, {"event": event})
        return httpx.Response(200, request=request)

    def close(self) -> None:
        self.closed = True


def test_the_window_is_checked_once_the_connection_is_up_and_before_the_headers_leave() -> None:
    seen: list[str] = []

    def prior(name: str, info: dict[str, Any]) -> None:
        assert info == {"event": name}
        seen.append(name)

    def request() -> httpx.Request:  # with a trace hook of its own, which must still be called
        return httpx.Request("POST", "http://p/", extensions={"trace": prior})

    wire = _Wire()
    transport = WindowedTransport(wire)
    passed = _window(-1)
    with sending(passed), pytest.raises(SendWindowPassed):
        transport.handle_request(request())
    # the connection was set up, the headers never started: nothing of the request left
    assert seen == ["connection.connect_tcp.started", "connection.connect_tcp.complete"]
    assert passed.refused

    seen.clear()
    open_window = _window(60)
    with sending(open_window):
        assert transport.handle_request(request()).status_code == 200
    assert len(seen) == 4 and not open_window.refused
    # outside `sending` (lookups, other clients) no window applies
    seen.clear()
    assert transport.handle_request(request()).status_code == 200
    assert len(seen) == 4
    transport.close()
    assert wire.closed


class _Echo(BaseHTTPRequestHandler):
    """Answers every request with the client's port: a new port is a new connection."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = str(self.client_address[1]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def echo() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join()


def test_the_client_keeps_connections_only_when_asked_and_follows_no_redirect(echo: str) -> None:
    with http_client(3.5) as client:
        assert client.timeout == httpx.Timeout(3.5)
        assert client.follow_redirects is False  # a redirect would be a second request
        ports = {client.get(echo).text for _ in range(3)}
        assert len(ports) == 1
    with http_client(3.5, reuse=False) as fresh:
        ports = {fresh.get(echo).text for _ in range(3)}
        assert len(ports) == 3


def test_a_refused_connection_through_the_client_is_recorded_as_not_sent() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with http_client(2.0) as client:
        exc = refusal(lambda: client.post(f"http://127.0.0.1:{port}/cases"))
    assert isinstance(exc, httpx.ConnectError)
    assert outcome_for_http_error(exc).code == NOT_SENT
