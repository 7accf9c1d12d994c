"""The adapter contract: what every provider module declares and implements.

An adapter is the only code that speaks a provider's protocol. It declares the provider's
retry `Contract` (as data the decision reads), sends one attempt, and looks up evidence.
It never raises a client library's exception upward: every failure becomes an `Outcome`
(confirmed, rejected, ambiguous) or a `LookupResult`, mapped at this edge.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import Field

from opledger.ledger import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Operation,
    Outcome,
    SendWindow,
    SendWindowPassed,
)
from opledger.ledger.contract import Contract, Idempotency, Limits, Lookup
from opledger.ledger.evidence import (
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    KEY_POISONED,
    NO_CONNECTION,
    NOT_SENT,
    SERVER_ERROR,
    THROTTLED,
    UNCODED_REFUSAL,
    unreached,
)
from opledger.ledger.models import Record, Rejected, Verdict

# A lookup's verdicts, for adapters' brevity.
CONFIRMED, REJECTED = Verdict.CONFIRMED, Verdict.REJECTED
ABSENT, PENDING, INCONCLUSIVE = Verdict.ABSENT, Verdict.PENDING, Verdict.INCONCLUSIVE
#: `detail["why"]` of a NOT_SENT attempt that found no free connection in our own client's
#: pool: a fact about us, not the provider, so its breaker does not count it
POOL_TIMEOUT = "pool_timeout"

__all__ = [
    "ABSENT",
    "CONFIRMED",
    "IDEMPOTENCY_MISMATCH",
    "INCONCLUSIVE",
    "IN_FLIGHT",
    "KEY_POISONED",
    "NOT_SENT",
    "NO_CONNECTION",
    "PENDING",
    "POOL_TIMEOUT",
    "REJECTED",
    "SERVER_ERROR",
    "THROTTLED",
    "UNCODED_REFUSAL",
    "Adapter",
    "AdapterExtras",
    "Contract",
    "ErrorCodes",
    "Idempotency",
    "Limits",
    "Lookup",
    "LookupResult",
    "Verdict",
    "extra",
    "outcome_for_http_error",
    "outcome_for_http_status",
    "retry_after_seconds",
    "sending",
    "throttled_outcome",
    "unreached",
]


class LookupResult(Record):
    """What a lookup learned: a verdict (confirmed, rejected, absent, pending,
    inconclusive), what it binds, and the provider's answer for the record."""

    verdict: Verdict
    binding: Binding = Binding()
    detail: dict[str, object] = Field(default_factory=dict)
    #: what the effect produced, when a confirming lookup can tell (as `Confirmed.result`)
    result: dict[str, object] | None = None


@runtime_checkable
class Adapter(Protocol):
    """One provider endpoint family, e.g. a CRM's case actions."""

    #: the provider's retry contract, as documented
    contract: Contract
    #: the versioned actions it serves, e.g. ("crm.close_case.v1",)
    actions: tuple[str, ...]

    def dispatch(self, claim: Claim) -> Outcome:
        """Send one attempt: `claim.payload` under `claim.idempotency_key`. Never raises.

        The worker calls it inside `sending(claim.window)`: requests made with
        `http_client` check the claim's send-by window after the connection is set up and
        before the first byte leaves. An adapter speaking another protocol calls
        `claim.window.check()` itself, right before the command that carries the effect
        (SMTP: after the envelope, before DATA). A refused check raises `SendWindowPassed`; map it
        like any other exception — the worker records the attempt as not sent anyway.
        """
        ...

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        """Ask the provider what became of `operation`. A read; never raises."""
        ...

    # Optional members (intent fields, a search hint, a contract probe, close, where its
    # requests go): `AdapterExtras` lists them, `extra()` reads them.


class AdapterExtras(Protocol):
    """What an adapter may offer beyond `Adapter`: every member is optional, and opledger
    reads each only through `extra(adapter, name)`, so this class is the one list of them.

    `Registry` reads `intent_fields`, `intent_scopes`, `payload_schemas`,
    `approval_policies` and `descriptions` (and calls `close` on shutdown); the review
    snapshot calls `search_hint`; `opledger contract check` sends `contract_probe`'s
    requests, and only to an endpoint that is loopback or the declared `test_base_url`
    (`base_url`, `url` or `host` say where the adapter's requests go); the check's sandbox
    settings name the `account`.
    """

    #: action -> the payload fields whose values make another act of it (see
    #: `opledger.ledger.intents`); an action left out is one act per run and target
    intent_fields: Mapping[str, Sequence[str]]
    #: action -> how wide one act of it is: "run" (one act per run: the default for an
    #: action left out) or "tenant" (one act whatever run or agent of the tenant asks: a
    #: refund of one charge, closing one case); a deployment may say otherwise
    #: (`OPLEDGER_INTENT_SCOPES`)
    intent_scopes: Mapping[str, str]
    #: action -> the JSON Schema of its payload (what an agent's tool offers, e.g. the MCP
    #: gateway's input schema); an action left out takes any JSON object
    payload_schemas: Mapping[str, Mapping[str, Any]]
    #: action -> when a person must approve an act of it before anything is sent
    #: ("never", the default; "always"; or rules over the target and the payload: see
    #: `opledger.ledger.approval_policy`); a deployment may say otherwise
    #: (`OPLEDGER_APPROVAL_POLICIES`)
    approval_policies: Mapping[str, Any]
    #: action -> what it does, in a sentence an agent's model reads (the target included)
    descriptions: Mapping[str, str]
    #: where the adapter's requests go: an HTTP base URL, a URL, or a host (SMTP)
    base_url: str
    url: str
    host: str
    #: the provider's test endpoint, which `contract check` may probe
    test_base_url: str | None
    #: the provider account the adapter acts in
    account: str

    def search_hint(self, operation: Operation) -> str | None:
        """What a person can search the provider for to find this operation's effect."""
        ...

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, Any]]:
        """The action, target and payload of `contract check`'s `variant`-th request."""
        ...

    def close(self) -> None:
        """Release the adapter's connections."""
        ...


#: the optional members `extra` reads
EXTRAS = frozenset(
    {"intent_fields", "intent_scopes", "payload_schemas", "approval_policies", "descriptions"}
    | {"base_url", "url", "host", "test_base_url", "account"}
    | {"search_hint", "contract_probe", "close"}
)


def extra(adapter: object, name: str) -> Any:
    """The optional member `name` of `adapter` (one of `AdapterExtras`), or None."""
    if name not in EXTRAS:
        raise AttributeError(f"{name!r} is not an optional adapter member (AdapterExtras)")
    return getattr(adapter, name, None)


def outcome_for_http_error(exc: Exception) -> Ambiguous:
    """Map any exception an HTTP call can raise to an ambiguous outcome.

    Nothing here is a definitive refusal: a timeout, a reset or a protocol error after the
    request left us says nothing about whether the provider applied it. Only a connection
    that was never made (refused, timed out while connecting, no free connection in the
    pool) proves that nothing was sent; its `detail["why"]` tells a connection the provider
    did not take (`NO_CONNECTION`) from our own pool being full (`POOL_TIMEOUT`).
    """
    if isinstance(exc, SendWindowPassed):  # refused at the wire: no byte left
        return Ambiguous(code=NOT_SENT, reason=str(exc)[:500], detail={"why": "window_passed"})
    if isinstance(exc, httpx.PoolTimeout):
        return Ambiguous(
            code=NOT_SENT,
            reason=f"no free connection in our own pool, nothing sent: {exc!r}"[:500],
            detail={"why": POOL_TIMEOUT},
        )
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        return unreached(f"no connection, nothing sent: {type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.TimeoutException):
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


def scoped(contract: Contract, where: str) -> Contract:
    """The contract with its key scope made concrete: `where` (the account and endpoint an
    adapter sends to) added unless the scope already names it. Every attempt records this
    scope, so a retry after the adapter was pointed elsewhere is not taken as protected."""
    idem = contract.idempotency
    if idem.kind != "keyed" or where in idem.scope:
        return contract
    concrete = f"{idem.scope} {where}".strip()
    return contract.model_copy(update={"idempotency": idem.model_copy(update={"scope": concrete})})


def reuses_connections(contract: Contract) -> bool:
    """Whether requests may go over kept-alive connections.

    A server may close an idle connection just as we send on it; the request never left,
    but all we see is a lost connection. That costs nothing where a same-key retry is
    protected; elsewhere it would send a request that never left to review, so each
    request gets a fresh connection and a lost one means it really was sent.
    """
    idem = contract.idempotency
    return idem.kind == "keyed" and idem.keys_durable and idem.after_error != "key_released"


def http_client(timeout: float, *, reuse: bool = True) -> httpx.Client:
    """An httpx client with its own retries off (the adapter and the decision own
    retrying) that honours the armed claim's send-by window at the wire."""
    return httpx.Client(
        timeout=httpx.Timeout(timeout),
        transport=WindowedTransport(
            httpx.HTTPTransport(
                retries=0,
                limits=httpx.Limits(max_keepalive_connections=None if reuse else 0),
            )
        ),
        follow_redirects=False,
    )


class ErrorCodes(Record):
    """A provider's error codes, by what they mean for the retry decision."""

    #: a definitive refusal of this request: nothing was applied
    definitive: frozenset[str] = frozenset()
    #: the target is already in the state asked for ("already closed", "already exists")
    conflicting_state: frozenset[str] = frozenset()
    #: a request with this key is still executing
    in_flight: frozenset[str] = frozenset()
    #: this key was used with another payload
    mismatch: frozenset[str] = frozenset()
    #: the key is refused after a failed attempt; a new one is wanted
    poisoned: frozenset[str] = frozenset()
    #: "not now": the provider is overloaded or our account is over its limit, under
    #: whatever status it comes (Salesforce answers 403 REQUEST_LIMIT_EXCEEDED); HTTP 429
    #: and a 503 with Retry-After say so without a code
    throttled: frozenset[str] = frozenset()


#: 4xx statuses that refuse the request itself; without a code we know, they are read as
#: refusals that our own earlier attempt may have caused (rule 11)
_REFUSALS = frozenset({400, 403, 404, 405, 409, 410, 413, 414, 415, 422})


def outcome_for_http_status(
    response: httpx.Response, codes: ErrorCodes, *, provider: str, keyed: bool | None = None
) -> Ambiguous | Rejected:
    """Map a non-success HTTP response to an outcome, by the provider's error code first.

    The same status means different things at different providers (a 409 may be "in
    progress" or "another payload"), so codes decide; a 4xx without a code we know is a
    refusal on a first attempt and ambiguous after one that may have applied; a 5xx and
    anything else is ambiguous. `keyed`: the request carried our idempotency key (by
    default: it had an `Idempotency-Key` header). Then a 409 or a 422 without a code we know
    is no refusal: an idempotency layer (the IETF Idempotency-Key draft, the middlewares
    that follow it) answers 409 while a request with the key still executes and 422 when
    the key carries another body, so the first is ambiguous and the second goes to a person.
    A "not now" (`throttled_outcome`) comes before every code: a 429 is never a refusal.
    """
    throttled = throttled_outcome(response, codes, provider=provider)
    if throttled is not None:
        return throttled
    status, code = response.status_code, error_code(response)
    replayed = response.headers.get("idempotent-replayed") == "true"
    detail: dict[str, object] = {"status": status, "code": code, "replayed": replayed}
    if code and code in codes.in_flight:
        return Ambiguous(
            code=IN_FLIGHT, reason="a request with this key is executing", detail=detail
        )
    if code and code in codes.mismatch:
        return Ambiguous(
            code=IDEMPOTENCY_MISMATCH, reason="key used with another payload", detail=detail
        )
    if code and code in codes.poisoned:
        return Ambiguous(code=KEY_POISONED, reason="the key wants replacing", detail=detail)
    known = code in codes.definitive | codes.conflicting_state
    if (keyed if keyed is not None else _sent_with_key(response)) and not known:
        uncoded = _uncoded_key_answer(response, status, code, replayed, detail)
        if uncoded is not None:
            return uncoded
    if 400 <= status < 500:
        if code and code in codes.definitive:
            return Rejected(code=code, reason=f"{provider} refused: {code}", detail=detail)
        if (code and code in codes.conflicting_state) or (
            status in _REFUSALS and code not in codes.definitive
        ):
            return Rejected(
                code=code or f"http_{status}",
                reason=f"{provider} refused: {code or _message(response) or status}"[:500],
                conflicting_state=True,
                detail=detail,
            )
    if status >= 500:
        return Ambiguous(
            code=SERVER_ERROR, reason=f"HTTP {status}", replayed=replayed, detail=detail
        )
    return Ambiguous(
        code=code or f"http_{status}", reason=f"HTTP {status}", replayed=replayed, detail=detail
    )


def throttled_outcome(
    response: httpx.Response, codes: ErrorCodes, *, provider: str
) -> Ambiguous | None:
    """The provider's "not now" as a THROTTLED outcome, or None when `response` is none.

    "Not now" is HTTP 429, a 503 that carries Retry-After (RFC 9110: the service is
    unavailable for that long), or an error code in `codes.throttled` under any status.
    `detail["retry_after_s"]` is the wait it asked for (None: it named none), uncapped: the
    decision caps it with the contract's `Limits.retry_after_max`. A stored answer the
    provider replays for our key is no "not now": waiting would change nothing, so it is
    read like any other replayed error.
    """
    status, code = response.status_code, error_code(response)
    if response.headers.get("idempotent-replayed") == "true":
        return None
    says_wait = status == 503 and "retry-after" in response.headers
    if not (status == 429 or says_wait or (code and code in codes.throttled)):
        return None
    wait = retry_after_seconds(response)
    said = f"HTTP {status}" + (f" {code}" if code else "")
    asked = f"; asked to wait {wait:g} s" if wait is not None else "; no wait named"
    return Ambiguous(
        code=THROTTLED,
        reason=f"{provider} said not now: {said}{asked}"[:500],
        detail={"status": status, "code": code, "replayed": False, "retry_after_s": wait},
    )


#: delta-seconds (RFC 9110 §10.2.3), and the decimal some providers send ("2.5"); a sign is
#: accepted so that a negative wait reads as none rather than as garbage
_DELTA_SECONDS = re.compile(r"[+-]?\d+(?:\.\d+)?")


def retry_after_seconds(response: httpx.Response, *, now: datetime | None = None) -> float | None:
    """How many seconds the response's Retry-After asks us to wait, or None.

    RFC 9110 §10.2.3: delta-seconds or an HTTP-date (its three formats), the date read
    against `now` (default: the current time). A wait in the past or a negative one is 0;
    a value that is neither is None. Not capped: the contract's limits do that. The
    RateLimit-Reset and X-RateLimit-Reset headers are not read: the first is an expired
    draft's, and providers disagree whether the second is seconds or a Unix time.
    """
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        seconds = float(value)
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT (asctime's format names no zone)
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def _sent_with_key(response: httpx.Response) -> bool:
    try:
        request = response.request
    except RuntimeError:  # a response built by hand has no request
        return False
    return "idempotency-key" in request.headers


def _uncoded_key_answer(
    response: httpx.Response, status: int, code: str, replayed: bool, detail: dict[str, object]
) -> Ambiguous | None:
    """A 409 or 422 to a keyed request, without a code we know (see `outcome_for_http_status`)."""
    said = _message(response)[:200]
    if said:
        detail = {**detail, "message": said}
    why = (
        f"HTTP {status}"
        + (f" {code!r}" if code else " without an error code")
        + (f" ({said})" if said else "")
    )
    if status == 409:
        return Ambiguous(
            code=f"http_{status}",
            reason=f"{why} to our keyed request: an idempotency layer answers so while a "
            "request with the key still executes; no refusal of this request",
            replayed=replayed,
            detail=detail,
        )
    if status == 422:
        return Ambiguous(
            code=UNCODED_REFUSAL,
            reason=f"{why} to our keyed request: a refusal of the request, or our key "
            "already used with another body (an idempotency layer answers so); nothing "
            "tells which",
            replayed=replayed,
            detail=detail,
        )
    return None


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        # a `detail` that is not text (a validation error's list) may quote the payload
        said = body.get("message") or body.get("detail")
        return said if isinstance(said, str) else ""
    return ""


def error_code(response: httpx.Response) -> str:
    """The provider's error code from a JSON error body, '' when there is none: `error.code`,
    a top-level `code`, or the first entry's `errorCode` of a list of errors (Salesforce's
    REST API answers so)."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if isinstance(body, list):
        first = body[0] if body else None
        return str(first.get("errorCode", "")) if isinstance(first, dict) else ""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("code", ""))
    return str(body.get("code", "")) if isinstance(body, dict) else ""
