"""The adapter contract: what every provider module declares and implements.

An adapter is the only code that speaks a provider's protocol. It declares the provider's
retry `Contract` (as data the decision reads), sends one attempt, and looks up evidence.
It never raises a client library's exception upward: every failure becomes an `Outcome`
(confirmed, rejected, ambiguous) or a `LookupResult`, mapped at this edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import httpx
from pydantic import Field

from opledger.ledger import Ambiguous, Attempt, Binding, Claim, Operation, Outcome
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
        """Send one attempt: `claim.payload` under `claim.key`. Never raises."""
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


def http_client(timeout: float) -> httpx.Client:
    """An httpx client with its own retries off: the adapter and the decision own retrying."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        transport=httpx.HTTPTransport(retries=0),
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
