"""A provider's "not now" and a connection never made, as the adapters map them.

A 429, a 503 that says when to come back, or a code the provider documents for overload
is THROTTLED, with the wait it asked for (RFC 9110's Retry-After: seconds or a date); it
comes before every other reading of the answer. A connection never made is NOT_SENT, and
says whether the provider did not take it or our own pool had no room.
"""

from __future__ import annotations

import smtplib
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from opledger.adapters.base import (
    NO_CONNECTION,
    NOT_SENT,
    POOL_TIMEOUT,
    SERVER_ERROR,
    THROTTLED,
    ErrorCodes,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    retry_after_seconds,
)
from opledger.adapters.crm import crm_contract
from opledger.adapters.email import email_contract
from opledger.adapters.presets import PRESETS, STRIPE_V1
from opledger.adapters.smtp import (
    outcome_for_smtp_connect_error,
    outcome_for_smtp_error,
    smtp_contract,
    smtp_not_now,
)
from opledger.adapters.stripe import stripe_contract
from opledger.adapters.webhook import WebhookAdapter, webhook_contract
from opledger.dev.faultproxy import FaultProxy
from opledger.ledger import Ambiguous, Rejected
from opledger.ledger.contract import Limits

from .histories import claim

REQUEST = httpx.Request("POST", "http://127.0.0.1/x", headers={"Idempotency-Key": "k"})
CODES = ErrorCodes(
    definitive=frozenset({"case_not_found"}),
    in_flight=frozenset({"key_in_use"}),
    throttled=frozenset({"REQUEST_LIMIT_EXCEEDED"}),
)
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def answer(status: int, body: object = None, **headers: str) -> httpx.Response:
    """A provider's answer to our keyed request (`Retry_After` -> `Retry-After`)."""
    named = {name.replace("_", "-"): value for name, value in headers.items()}
    return httpx.Response(
        status, json=body if body is not None else {}, headers=named, request=REQUEST
    )


def mapped(response: httpx.Response) -> Ambiguous | Rejected:
    return outcome_for_http_status(response, CODES, provider="the CRM")


# -- "not now" ----------------------------------------------------------------------------------


def test_a_429_without_retry_after_is_throttled_and_names_no_wait() -> None:
    outcome = mapped(answer(429, {"error": {"code": "slow_down"}}))
    assert isinstance(outcome, Ambiguous) and outcome.code == THROTTLED
    assert outcome.detail == {
        "status": 429,
        "code": "slow_down",
        "replayed": False,
        "retry_after_s": None,
    }
    assert "not now" in outcome.reason and "no wait named" in outcome.reason


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("7", 7.0), ("0", 0.0), (" 120 ", 120.0), ("2.5", 2.5), ("-3", 0.0), ("+4", 4.0)],
)
def test_a_429_carries_the_seconds_its_retry_after_asks_for(value: str, seconds: float) -> None:
    outcome = mapped(answer(429, Retry_After=value))
    assert outcome.code == THROTTLED
    assert outcome.detail["retry_after_s"] == seconds


@pytest.mark.parametrize("value", ["soon", "", "1e3", "0x10", "1_000", "nan", "inf", "2.", ".5"])
def test_a_retry_after_that_is_neither_seconds_nor_a_date_names_no_wait(value: str) -> None:
    outcome = mapped(answer(429, Retry_After=value))
    assert outcome.code == THROTTLED  # still a "not now"
    assert outcome.detail["retry_after_s"] is None


def test_an_absurdly_long_retry_after_is_kept_as_said_for_the_contract_to_cap() -> None:
    assert retry_after_seconds(answer(429, Retry_After="86400")) == 86400.0
    assert retry_after_seconds(answer(429, Retry_After="9" * 400)) is None  # not a number


def test_a_429_with_an_http_date_waits_until_that_date() -> None:
    later = datetime.now(UTC) + timedelta(seconds=30)
    outcome = mapped(answer(429, Retry_After=format_datetime(later, usegmt=True)))
    assert outcome.code == THROTTLED
    wait = outcome.detail["retry_after_s"]
    assert isinstance(wait, float) and 27.0 < wait <= 30.0


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("Sun, 01 Mar 2026 12:00:45 GMT", 45.0),  # IMF-fixdate
        ("Sunday, 01-Mar-26 12:01:00 GMT", 60.0),  # RFC 850, obsolete but to be accepted
        ("Sun Mar  1 12:00:05 2026", 5.0),  # asctime, no zone: GMT
        ("Sun, 01 Mar 2026 11:59:00 GMT", 0.0),  # already past: no wait
        ("Sun, 01 Mar 2026 14:00:10 +0200", 10.0),  # an offset, as some servers send
        ("Sun, 45 Mar 2026 12:00:00 GMT", None),  # no such day
    ],
)
def test_retry_after_reads_each_http_date_format_against_now(
    value: str, seconds: float | None
) -> None:
    assert retry_after_seconds(answer(429, Retry_After=value), now=NOW) == seconds


def test_a_503_is_throttled_only_when_it_says_when_to_come_back() -> None:
    busy = mapped(answer(503, {"error": {"code": "overloaded"}}, Retry_After="3"))
    assert isinstance(busy, Ambiguous) and busy.code == THROTTLED
    assert busy.detail["retry_after_s"] == 3.0 and busy.detail["status"] == 503
    broken = mapped(answer(503, {"error": {"code": "overloaded"}}))
    assert isinstance(broken, Ambiguous) and broken.code == SERVER_ERROR
    # a Retry-After on another 5xx says nothing about overload
    failed = mapped(answer(500, Retry_After="3"))
    assert failed.code == SERVER_ERROR


def test_a_documented_overload_code_is_throttled_under_any_status() -> None:
    # Salesforce: 403 with a list of errors naming REQUEST_LIMIT_EXCEEDED
    body = [{"message": "TotalRequests Limit exceeded.", "errorCode": "REQUEST_LIMIT_EXCEEDED"}]
    outcome = mapped(answer(403, body))
    assert isinstance(outcome, Ambiguous) and outcome.code == THROTTLED
    assert outcome.detail["code"] == "REQUEST_LIMIT_EXCEEDED"
    nested = mapped(answer(400, {"error": {"code": "REQUEST_LIMIT_EXCEEDED"}}))
    assert nested.code == THROTTLED
    # the same 403 without that code is a refusal, as before
    other = mapped(answer(403, [{"errorCode": "INSUFFICIENT_ACCESS"}]))
    assert isinstance(other, Rejected) and other.code == "INSUFFICIENT_ACCESS"


@pytest.mark.parametrize("code", ["case_not_found", "key_in_use"])
def test_a_429_is_never_a_refusal_nor_in_flight_whatever_code_it_carries(code: str) -> None:
    outcome = mapped(answer(429, {"error": {"code": code}}))
    assert isinstance(outcome, Ambiguous) and outcome.code == THROTTLED


def test_a_replayed_429_is_a_stored_answer_not_a_fresh_not_now() -> None:
    replay = mapped(answer(429, {"error": {"code": "slow_down"}}, Idempotent_Replayed="true"))
    assert isinstance(replay, Ambiguous) and replay.code != THROTTLED and replay.replayed


# -- what each bundled adapter declares ---------------------------------------------------------


def test_the_sandbox_and_stripe_contracts_say_a_not_now_applied_nothing() -> None:
    assert crm_contract().limits.throttle_applies_nothing
    assert email_contract().limits.throttle_applies_nothing
    assert STRIPE_V1.limits.throttle_applies_nothing
    # our fleet's own limits may be given; the provider's fact stays
    ours = crm_contract(limits=Limits(concurrency=2, rate=20, burst=2)).limits
    assert (ours.concurrency, ours.rate, ours.burst) == (2, 20, 2)
    assert ours.throttle_applies_nothing
    stripe = stripe_contract(limits=Limits(rate=50)).limits
    assert stripe.rate == 50 and stripe.throttle_applies_nothing
    # where it is not documented, the cautious default
    assert not webhook_contract().limits.throttle_applies_nothing
    undocumented = [p for p, c in PRESETS.items() if c.limits.throttle_applies_nothing]
    assert undocumented == ["stripe.v1"]


class _Answers(BaseHTTPRequestHandler):
    """Answers every POST with the status and headers the test queued, in order."""

    queue: ClassVar[list[tuple[int, dict[str, str]]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        status, headers = self.queue.pop(0)
        body = b'{"error": {"code": "busy"}}'
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    ("status", "headers", "code"),
    [
        (429, {}, THROTTLED),
        (429, {"Retry-After": "4"}, THROTTLED),
        (503, {"Retry-After": "4"}, THROTTLED),
        (503, {}, SERVER_ERROR),
        (400, {}, "http_400"),
    ],
)
def test_the_webhook_adapter_reads_a_not_now_like_every_other(
    receiver: str, status: int, headers: dict[str, str], code: str
) -> None:
    _Answers.queue[:] = [(status, headers)]
    adapter = WebhookAdapter(receiver)
    try:
        outcome = adapter.dispatch(claim())
    finally:
        adapter.close()
    assert outcome.code == code  # type: ignore[union-attr]
    if code == THROTTLED:
        assert isinstance(outcome, Ambiguous)
        expected = float(headers["Retry-After"]) if headers else None
        assert outcome.detail["retry_after_s"] == expected


# -- a connection never made ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError("refused", request=REQUEST),
        httpx.ConnectTimeout("no answer", request=REQUEST),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_connection_the_provider_never_took_is_not_sent_for_want_of_one(exc: Exception) -> None:
    outcome = outcome_for_http_error(exc)
    assert outcome.code == NOT_SENT
    assert outcome.detail == {"why": NO_CONNECTION}


def test_a_full_pool_of_our_own_is_not_sent_and_not_the_providers_doing() -> None:
    outcome = outcome_for_http_error(httpx.PoolTimeout("no free connection", request=REQUEST))
    assert outcome.code == NOT_SENT
    assert outcome.detail == {"why": POOL_TIMEOUT} and POOL_TIMEOUT != NO_CONNECTION
    assert "pool" in outcome.reason


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_provider_that_comes_back_on_its_port_is_reached_there(receiver: str) -> None:
    """A refused connect is NOT_SENT/no_connection; a fault proxy started on that very port
    later (the provider is back) forwards the next request, and can be bound again."""
    port = _unused_port()
    url = f"http://127.0.0.1:{port}/hook"
    with http_client(2.0) as client:
        try:
            client.post(url, content=b"{}")
        except Exception as exc:
            refused = outcome_for_http_error(exc)
        else:
            pytest.fail("something listens on the unused port")
        assert (refused.code, refused.detail) == (NOT_SENT, {"why": NO_CONNECTION})
        upstream = ("127.0.0.1", int(receiver.rsplit(":", 1)[1].split("/")[0]))
        for _ in range(2):  # started, stopped, and started again on the same port
            _Answers.queue[:] = [(204, {})]
            with FaultProxy(upstream, port=port) as proxy:
                assert proxy.address == ("127.0.0.1", port)
                assert (
                    client.post(url, content=b"{}", headers={"Connection": "close"}).status_code
                    == 204
                )
                assert proxy.connections == 1


def test_an_smtp_server_that_refuses_the_connection_is_not_sent_for_want_of_one() -> None:
    try:
        smtplib.SMTP("127.0.0.1", _unused_port(), timeout=2)
    except Exception as exc:
        outcome = outcome_for_smtp_connect_error(exc)
    else:
        pytest.fail("something listens on the unused port")
    assert isinstance(outcome, Ambiguous) and outcome.code == NOT_SENT
    assert outcome.detail == {"why": NO_CONNECTION}


def test_an_smtp_server_that_answers_421_at_once_took_the_connection_and_said_not_now() -> None:
    """A 421 greeting is the server's answer (it took the connection): its "not now"."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def greet() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.sendall(b"421 4.3.2 too busy, try later\r\n")

        thread = threading.Thread(target=greet)
        thread.start()
        try:
            smtplib.SMTP("127.0.0.1", listener.getsockname()[1], timeout=2)
        except Exception as exc:
            outcome = outcome_for_smtp_connect_error(exc)
        else:
            pytest.fail("a 421 greeting did not fail the connection")
        thread.join(5)
    assert isinstance(outcome, Ambiguous) and outcome.code == THROTTLED
    assert outcome.detail == {"smtp_code": 421, "replayed": False, "retry_after_s": None}
    assert "421 4.3.2 too busy" in outcome.reason


@pytest.mark.parametrize(
    ("code", "reply"),
    [
        (421, b"4.7.0 mail.test Error: too many connections from 127.0.0.1"),  # Postfix
        (421, b"Service not available, closing transmission channel"),  # no enhanced code
        (450, b"4.7.1 Error: too much mail from 127.0.0.1"),  # Postfix's message rate
        (451, b"4.7.1 Greylisted, please try again later"),
        (451, b"4.7.500 Server busy. Please try again later"),  # Exchange Online
        (452, b"4.3.1 Insufficient system storage"),
        (452, b"4.4.5 System congestion"),
        (454, b"Throttling failure: Maximum sending rate exceeded."),  # Amazon SES
        (450, "4.7.28 rate limited"),  # the reply as text
    ],
)
def test_an_smtp_server_busy_or_limiting_us_says_not_now(code: int, reply: bytes | str) -> None:
    outcome = smtp_not_now(code, reply)
    assert outcome is not None and outcome.code == THROTTLED
    assert outcome.detail["smtp_code"] == code and outcome.detail["retry_after_s"] is None
    for exc in (
        smtplib.SMTPSenderRefused(code, reply, "s@x"),  # type: ignore[arg-type]
        smtplib.SMTPRecipientsRefused({"a@b": (code, reply)}),  # type: ignore[dict-item]
        smtplib.SMTPDataError(code, reply),
        smtplib.SMTPConnectError(code, reply),
    ):
        for sent in (False, True):
            mapped = outcome_for_smtp_error(exc, message_sent=sent)
            assert isinstance(mapped, Ambiguous) and mapped.code == THROTTLED, exc


@pytest.mark.parametrize(
    ("code", "reply"),
    [
        (452, b"4.2.2 Mailbox full"),  # this recipient, not the server
        (450, b"4.2.1 Mailbox busy"),
        (451, b"Requested action aborted: local error in processing"),
        (451, b"4.70.1 no such class"),  # not an enhanced code RFC 3463 knows
        (450, b"later 4.7.1"),  # the enhanced code comes first or not at all
        (550, b"5.7.1 Relaying denied"),  # a permanent refusal
        (250, b"2.0.0 OK"),
    ],
)
def test_other_smtp_replies_are_no_not_now(code: int, reply: bytes) -> None:
    assert smtp_not_now(code, reply) is None
    mapped = outcome_for_smtp_error(smtplib.SMTPDataError(code, reply), message_sent=False)
    assert not (isinstance(mapped, Ambiguous) and mapped.code == THROTTLED)


def test_the_smtp_contract_says_a_not_now_applied_nothing_and_waits_a_minute() -> None:
    limits = smtp_contract().limits
    assert limits.throttle_applies_nothing
    assert limits.retry_after_default == timedelta(minutes=1)
    own = smtp_contract(limits=Limits(concurrency=2, retry_after_default=timedelta(seconds=5)))
    assert own.limits.throttle_applies_nothing and own.limits.concurrency == 2
    assert own.limits.retry_after_default == timedelta(seconds=5)
