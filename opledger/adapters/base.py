"""The adapter contract: what every provider module declares and implements.

An adapter is the only code that speaks a provider's protocol. It declares the provider's
retry `Contract` (as data the decision reads), sends one attempt, and looks up evidence.
It never raises a client library's exception upward: every failure becomes an `Outcome`
(confirmed, rejected, ambiguous) or a `LookupResult`, mapped at this edge.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import Field

from opledger.ledger import Ambiguous, Attempt, Binding, Claim, Operation, Outcome, SendWindow
from opledger.ledger.contract import Contract, Idempotency, Lookup
from opledger.ledger.decide import (
    ABSENT,
    CONFIRMED,
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    INCONCLUSIVE,
    KEY_POISONED,
    PENDING,
    REJECTED,
    SERVER_ERROR,
)
from opledger.ledger.models import Record

__all__ = [
    "ABSENT",
    "CONFIRMED",
    "IDEMPOTENCY_MISMATCH",
    "INCONCLUSIVE",
    "IN_FLIGHT",
    "KEY_POISONED",
    "PENDING",
    "REJECTED",
    "SERVER_ERROR",
    "Adapter",
    "Contract",
    "Idempotency",
    "Lookup",
    "LookupResult",
    "outcome_for_http_error",
    "sending",
]


class LookupResult(Record):
    """What a lookup learned: a verdict (confirmed, rejected, absent, pending,
    inconclusive), what it binds, and the provider's answer for the record."""

    verdict: str
    binding: Binding = Binding()
    detail: dict[str, object] = Field(default_factory=dict)


@runtime_checkable
class Adapter(Protocol):
    """One provider endpoint family, e.g. a CRM's case actions."""

    #: the provider's retry contract, as documented
    contract: Contract
    #: the versioned actions it serves, e.g. ("crm.close_case.v1",)
    actions: tuple[str, ...]

    def dispatch(self, claim: Claim) -> Outcome:
        """Send one attempt: `claim.payload` under `claim.key`. Never raises.

        The worker calls it inside `sending(claim.window)`: requests made with
        `http_client` check the claim's send-by window after the connection is set up and
        before the first byte leaves. An adapter speaking another protocol calls
        `claim.window.check()` itself, right before the command that carries the effect
        (SMTP: after EHLO, before MAIL). A refused check raises `SendWindowPassed`; map it
        like any other exception — the worker records the attempt as not sent anyway.
        """
        ...

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        """Ask the provider what became of `operation`. A read; never raises."""
        ...


def outcome_for_http_error(exc: Exception) -> Ambiguous:
    """Map any exception an HTTP call can raise to an ambiguous outcome.

    Nothing here is a definitive refusal: a timeout, a reset or a protocol error after the
    request left us says nothing about whether the provider applied it.
    """
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        code = "connect_failed"
    elif isinstance(exc, httpx.TimeoutException):
        code = "timeout"
    elif isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        code = "connection_lost"
    elif isinstance(exc, httpx.HTTPError | httpx.InvalidURL | httpx.CookieConflict):
        code = "http_error"
    elif isinstance(exc, httpx.StreamError):
        code = "stream_error"
    elif isinstance(exc, TimeoutError):
        code = "timeout"
    elif isinstance(exc, OSError):
        code = "connection_lost"
    elif isinstance(exc, ValueError):  # a body that is not the JSON we expect
        code = "unreadable_response"
    else:
        code = "client_error"
    return Ambiguous(code=code, reason=f"{type(exc).__name__}: {exc}"[:500])


_WINDOW: ContextVar[SendWindow | None] = ContextVar("opledger_send_window", default=None)


@contextmanager
def sending(window: SendWindow) -> Iterator[SendWindow]:
    """Arm `window` for the requests this thread makes inside the block."""
    token = _WINDOW.set(window)
    try:
        yield window
    finally:
        _WINDOW.reset(token)


def _headers_started(name: str) -> bool:
    # httpcore's trace events: "http11.send_request_headers.started" (and "http2...."),
    # after "connection.connect_tcp" / "connection.start_tls" have completed.
    return name.endswith("send_request_headers.started")


class WindowedTransport(httpx.BaseTransport):
    """Refuses to send once the armed claim's send-by window has passed.

    The check runs from httpcore's trace hook when the request headers are about to be
    written: after the connection (TCP, TLS) is set up or taken from the pool, before any
    byte of the request leaves. Outside `sending(...)` (lookups, other clients) it does
    nothing.
    """

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        window = _WINDOW.get()
        if window is not None:
            prior: Callable[..., Any] | None = request.extensions.get("trace")

            def trace(name: str, info: dict[str, Any]) -> None:
                if _headers_started(name):
                    window.check()
                if prior is not None:
                    prior(name, info)

            request.extensions = {**request.extensions, "trace": trace}
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def http_client(timeout: float) -> httpx.Client:
    """An httpx client with its own retries off (the adapter and the decision own
    retrying) that honours the armed claim's send-by window at the wire."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        transport=WindowedTransport(httpx.HTTPTransport(retries=0)),
        follow_redirects=False,
    )


def error_code(response: httpx.Response) -> str:
    """The provider's error code from a JSON error body, '' when there is none."""
    try:
        body = response.json()
    except ValueError:
        return ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", ""))
    return str(body.get("code", "")) if isinstance(body, dict) else ""
