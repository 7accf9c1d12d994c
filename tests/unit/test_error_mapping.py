"""Every exception the HTTP and SMTP clients can raise is mapped at the adapter edge."""

from __future__ import annotations

import inspect
import smtplib
import socket
import ssl
from typing import TypeVar

import httpx
import pytest

from opledger.adapters.base import ErrorCodes, outcome_for_http_error, outcome_for_http_status
from opledger.adapters.smtp import outcome_for_smtp_error
from opledger.ledger import Ambiguous, Rejected

E = TypeVar("E", bound=Exception)


def _subclasses(root: type[E]) -> set[type[E]]:
    found: set[type[E]] = set()
    todo = [root]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


HTTPX_EXCEPTIONS = sorted(
    (
        obj
        for name in httpx.__all__
        if inspect.isclass(obj := getattr(httpx, name)) and issubclass(obj, Exception)
    ),
    key=lambda cls: cls.__name__,
)


def _instance(cls: type[Exception]) -> Exception:
    request = httpx.Request("POST", "http://127.0.0.1/")
    for args, kwargs in (
        (("boom",), {"request": request}),
        (("boom",), {"request": request, "response": httpx.Response(500, request=request)}),
        (("boom",), {}),
        ((), {}),
    ):
        try:
            return cls(*args, **kwargs)
        except TypeError:
            continue
    raise AssertionError(f"cannot build {cls}")


def test_the_httpx_exception_list_is_not_empty() -> None:
    assert httpx.ReadTimeout in HTTPX_EXCEPTIONS and httpx.RemoteProtocolError in HTTPX_EXCEPTIONS
    assert len(HTTPX_EXCEPTIONS) >= 20


@pytest.mark.parametrize("cls", HTTPX_EXCEPTIONS, ids=lambda c: c.__name__)
def test_every_httpx_exception_becomes_an_ambiguous_outcome(cls: type[Exception]) -> None:
    outcome = outcome_for_http_error(_instance(cls))
    assert isinstance(outcome, Ambiguous)
    assert outcome.code != "client_error", f"{cls.__name__} fell through to the catch-all"


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (httpx.ConnectError("refused"), "not_sent"),
        (httpx.ConnectTimeout("no answer"), "not_sent"),
        (httpx.PoolTimeout("no free connection"), "not_sent"),
        (httpx.ReadTimeout("slow"), "timeout"),
        (httpx.RemoteProtocolError("peer closed"), "connection_lost"),
        (ConnectionResetError("reset"), "connection_lost"),
        (TimeoutError("slow"), "timeout"),
        (ValueError("not json"), "unreadable_response"),
    ],
)
def test_http_codes(exc: Exception, code: str) -> None:
    assert outcome_for_http_error(exc).code == code


SMTP_EXCEPTIONS: list[type[Exception]] = sorted(
    {smtplib.SMTPException, *_subclasses(smtplib.SMTPException)}, key=lambda c: c.__name__
)


def _smtp_instance(cls: type[Exception]) -> Exception:
    if cls is smtplib.SMTPRecipientsRefused:
        return cls({"a@b": (550, b"no such user")})
    if cls is smtplib.SMTPSenderRefused:
        return cls(553, b"bad sender", "s@x")
    if issubclass(cls, smtplib.SMTPResponseException):
        return cls(451, b"try later")
    return cls("boom")


@pytest.mark.parametrize("cls", SMTP_EXCEPTIONS, ids=lambda c: c.__name__)
def test_every_smtplib_exception_is_mapped(cls: type[Exception]) -> None:
    outcome = outcome_for_smtp_error(_smtp_instance(cls))
    assert isinstance(outcome, Ambiguous | Rejected)
    assert getattr(outcome, "code", "") != "client_error"


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("slow"),
        ConnectionRefusedError("refused"),
        ConnectionResetError("reset"),
        BrokenPipeError("pipe"),
        socket.gaierror("dns"),
        ssl.SSLError("tls"),
        OSError("other"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_socket_errors_during_smtp_are_ambiguous(exc: Exception) -> None:
    outcome = outcome_for_smtp_error(exc)
    assert isinstance(outcome, Ambiguous) and outcome.code in ("timeout", "connection_lost")


def test_smtp_permanent_refusals_reject_and_temporary_ones_do_not() -> None:
    assert isinstance(outcome_for_smtp_error(smtplib.SMTPDataError(554, b"rejected")), Rejected)
    sender = smtplib.SMTPSenderRefused(553, b"bad sender", "s@x")
    assert isinstance(outcome_for_smtp_error(sender), Rejected)
    refused = smtplib.SMTPRecipientsRefused({"a@b": (550, b"x"), "c@d": (450, b"y")})
    assert isinstance(outcome_for_smtp_error(refused), Ambiguous)


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError("refused"),
        TimeoutError("no greeting"),
        smtplib.SMTPServerDisconnected("closed before MAIL"),
        smtplib.SMTPSenderRefused(451, b"later", "s@x"),
        smtplib.SMTPRecipientsRefused({"a@b": (450, b"later")}),
    ],
    ids=lambda e: type(e).__name__,
)
def test_smtp_failures_before_data_sent_nothing(exc: Exception) -> None:
    outcome = outcome_for_smtp_error(exc, message_sent=False)
    assert isinstance(outcome, Ambiguous) and outcome.code == "not_sent"


def test_a_temporary_refusal_after_data_took_no_custody() -> None:
    outcome = outcome_for_smtp_error(smtplib.SMTPDataError(451, b"later"), message_sent=True)
    assert isinstance(outcome, Ambiguous) and outcome.code == "not_sent"
    cut = outcome_for_smtp_error(smtplib.SMTPServerDisconnected("gone"), message_sent=True)
    assert isinstance(cut, Ambiguous) and cut.code == "connection_lost"


CODES = ErrorCodes(
    definitive=frozenset({"case_not_found"}),
    conflicting_state=frozenset({"case_already_closed"}),
    in_flight=frozenset({"key_in_use"}),
    mismatch=frozenset({"key_reused"}),
    poisoned=frozenset({"key_failed"}),
)


def _response(status: int, body: object, **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


@pytest.mark.parametrize(
    ("status", "body", "kind", "code", "conflicting"),
    [
        (404, {"error": {"code": "case_not_found"}}, "rejected", "case_not_found", False),
        (409, {"error": {"code": "case_already_closed"}}, "rejected", "case_already_closed", True),
        (409, {"error": {"code": "key_in_use"}}, "ambiguous", "in_flight", False),
        (409, {"error": {"code": "key_reused"}}, "ambiguous", "idempotency_mismatch", False),
        (422, {"error": {"code": "key_failed"}}, "ambiguous", "key_poisoned", False),
        # a provider whose error bodies carry only a message: a refusal at once, but one our
        # own earlier attempt may have caused
        (422, {"message": "case is closed"}, "rejected", "http_422", True),
        (400, {"message": "bad request"}, "rejected", "http_400", True),
        (429, {"message": "slow down"}, "ambiguous", "throttled", False),
        (408, {}, "ambiguous", "http_408", False),
        (500, {"message": "oops"}, "ambiguous", "server_error", False),
        (503, {"error": {"code": "case_not_found"}}, "ambiguous", "server_error", False),
    ],
)
def test_http_statuses_are_read_by_code_first(
    status: int, body: object, kind: str, code: str, conflicting: bool
) -> None:
    outcome = outcome_for_http_status(_response(status, body), CODES, provider="p")
    assert (outcome.kind, outcome.code) == (kind, code)
    assert getattr(outcome, "conflicting_state", False) is conflicting


def test_a_replayed_error_is_marked() -> None:
    response = _response(500, {"message": "oops"}, **{"Idempotent-Replayed": "true"})
    outcome = outcome_for_http_status(response, CODES, provider="p")
    assert isinstance(outcome, Ambiguous) and outcome.replayed


def _keyed_response(status: int, body: object) -> httpx.Response:
    request = httpx.Request("POST", "http://127.0.0.1/x", headers={"Idempotency-Key": "k"})
    return httpx.Response(status, json=body, request=request)


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        # an idempotency middleware's "still processing": a detail message, no code
        (409, {"detail": "A request with this key is still being processed"}, "http_409"),
        (409, {"error": {"code": "something_else"}}, "http_409"),
        # the IETF draft's "key reused with another body", or a validation error: unknown
        (422, {"detail": "Idempotency key reused"}, "uncoded_refusal"),
        (422, {"message": "case is closed"}, "uncoded_refusal"),
    ],
)
def test_an_uncoded_409_or_422_to_a_keyed_request_is_no_refusal(
    status: int, body: object, code: str
) -> None:
    outcome = outcome_for_http_status(_keyed_response(status, body), CODES, provider="p")
    assert isinstance(outcome, Ambiguous) and outcome.code == code
    assert "keyed request" in outcome.reason
    # the same answers without a key are refusals (nothing to collide with), as before
    unkeyed = outcome_for_http_status(_response(status, body), CODES, provider="p")
    assert isinstance(unkeyed, Rejected) and unkeyed.conflicting_state
    # and so are they where the adapter says the request carried no key
    told = outcome_for_http_status(_keyed_response(status, body), CODES, provider="p", keyed=False)
    assert isinstance(told, Rejected)


def test_coded_refusals_to_a_keyed_request_keep_their_meaning() -> None:
    closed = {"error": {"code": "case_already_closed"}}
    outcome = outcome_for_http_status(_keyed_response(409, closed), CODES, provider="p")
    assert isinstance(outcome, Rejected) and outcome.conflicting_state
    gone = outcome_for_http_status(
        _keyed_response(422, {"error": {"code": "case_not_found"}}), CODES, provider="p"
    )
    assert isinstance(gone, Rejected) and gone.code == "case_not_found"
    in_use = outcome_for_http_status(
        _keyed_response(409, {"error": {"code": "key_in_use"}}), CODES, provider="p"
    )
    assert isinstance(in_use, Ambiguous) and in_use.code == "in_flight"


def test_a_validation_list_in_an_error_body_is_not_quoted() -> None:
    """A FastAPI-style 422 lists the offending inputs: those are payload values, kept out
    of the recorded reason."""
    body = {"detail": [{"loc": ["body", "card"], "msg": "bad", "input": "4242424242424242"}]}
    outcome = outcome_for_http_status(_keyed_response(422, body), CODES, provider="p")
    assert "4242424242424242" not in outcome.reason
    assert "4242424242424242" not in str(outcome.detail)
