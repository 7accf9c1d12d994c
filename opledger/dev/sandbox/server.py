"""Simulated providers as real servers: a CRM and an email API over HTTP, and SMTP.

They behave like the real providers the contracts describe (docs/contracts.md), and every
protection they offer is a switch, so a test can prove that opledger (not the provider)
prevented a duplicate:

- idempotency keys per account with a retention window; the first response is stored and
  replayed, a 500 included (as Stripe's v1 API does); another payload under a used key is
  refused (CRM 422, email 409 with its own error code); a request arriving while the first
  one with its key executes gets a 409 (switchable);
- a status API by key (CRM), a search that lags (both), edits by "other users" (CRM);
- per-request faults: commit then drop the response, commit then answer too late, a 500
  before or after the commit, a 503 "overloaded" with Retry-After before anything; SMTP
  can drop the connection after accepting DATA;
- per-account limits on the writes (CRM case actions, email sends): requests in flight at
  once, and a rate with a burst (a token bucket); a request over either gets a 429 with
  Retry-After before its key is read or anything is applied;
- ground truth: how many times each effect was applied, every admitted request per key
  with its arrival and completion times, and per account what its limits admitted and
  refused.

Run it with `opledger sandbox` or `python -m opledger.dev.sandbox`; tests use
`opledger.dev.sandbox.Sandbox`. State is in memory and starts empty.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from email import message_from_bytes
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

FAULT_MODES = (
    "drop_after_commit",  # the effect is applied, then the connection is cut mid-response
    "delay_after_commit",  # the effect is applied, the response comes after `delay` seconds
    "error_before_commit",  # a 500 and no effect
    "error_after_commit",  # the effect is applied, then a 500
    "drop_after_data",  # SMTP: the message is accepted, the connection closes before the 250
    "refuse_after_data",  # SMTP: the body is refused for good (554), nothing accepted
    "defer_after_data",  # SMTP: the body is refused for now (451), nothing accepted
    "overloaded",  # CRM, email: a 503 with Retry-After `delay_s`, before anything is read
)
#: the faults that strike at the front door, before the limits, the key and the effect
FRONT_DOOR = ("overloaded",)
#: the providers whose writes pass the front door (faults there, per-account limits)
LIMITED_PROVIDERS = ("crm", "email")


@dataclass
class Config:
    """One account's behaviour. Each switch is a way real providers differ."""

    keys: bool = True  #: deduplicate by Idempotency-Key
    inflight_conflict: bool = True  #: 409 while a request with the same key executes
    inflight_wait_s: float = 0.0  #: hold such a concurrent request this long before the 409
    status_api: bool = True  #: CRM status endpoint by key, from the provider's own records
    #: store and replay error responses under the key; off, a 5xx releases the key (even
    #: when the change was applied before the failure), as many middlewares do
    replay_errors: bool = True
    payload_check: bool = True  #: refuse a used key with another payload; off, replay anyway
    keys_durable: bool = True  #: off, `/_admin/restart` forgets this account's keys
    error_codes: bool = True  #: error bodies carry a code; off, only a message
    echo_digest: bool = True  #: success bodies name our key and the body's digest
    max_key_length: int = 0  #: refuse longer keys with 400 (0: any length)
    retention_s: float = 24 * 3600.0  #: how long keys are remembered
    search_lag_s: float = 0.0  #: how long until an applied effect shows in search
    processing_s: float = 0.0  #: how long a request executes before it commits
    #: write requests executing at once; one more gets a 429 (0: unlimited)
    max_concurrent: int = 0
    #: write requests admitted per second, with `burst` at once after a quiet spell (a
    #: token bucket); one more gets a 429 (0: unlimited)
    rate_per_s: float = 0.0
    burst: int = 1


@dataclass
class Fault:
    provider: str
    mode: str
    times: int = 1
    delay_s: float = 0.0
    key: str | None = None  #: only requests with this key (None: any)


@dataclass
class Limiter:
    """One account's front door: a token bucket (`Config.rate_per_s`, `Config.burst`), the
    write requests in flight, and the ground truth of what it admitted and refused."""

    tokens: float | None = None  #: None: never used, so full
    refilled: float = 0.0
    in_flight: int = 0
    admitted: int = 0
    over_concurrency: int = 0
    over_rate: int = 0
    overloaded: int = 0
    max_in_flight: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None

    def admit(self, cfg: Config, now: float) -> float | None:
        """Admit one request (None: it is now in flight until `release`), or refuse it: the
        seconds until it could be admitted."""
        if cfg.max_concurrent > 0 and self.in_flight >= cfg.max_concurrent:
            self.over_concurrency += 1
            return 1.0
        if cfg.rate_per_s > 0:
            burst = max(1, cfg.burst)
            if self.tokens is None:
                self.tokens = float(burst)
            else:
                gained = (now - self.refilled) * cfg.rate_per_s
                self.tokens = min(float(burst), self.tokens + gained)
            self.refilled = now
            if self.tokens < 1:
                self.over_rate += 1
                return (1 - self.tokens) / cfg.rate_per_s
            self.tokens -= 1
        self.in_flight += 1
        self.admitted += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.first_admitted_at is None:
            self.first_admitted_at = now
        self.last_admitted_at = now
        return None

    def release(self) -> None:
        """The admitted request finished executing (its answer is about to be sent)."""
        self.in_flight -= 1

    def report(self) -> dict[str, Any]:
        return {
            "admitted": self.admitted,
            "over_limit": self.over_concurrency + self.over_rate,
            "over_concurrency": self.over_concurrency,
            "over_rate": self.over_rate,
            "overloaded": self.overloaded,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "first_admitted_at": self.first_admitted_at,
            "last_admitted_at": self.last_admitted_at,
        }


@dataclass
class KeyEntry:
    digest: str
    created: float
    state: str = "in_progress"
    status_code: int = 0
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    status: str = "open"
    version: int = 1
    fields: dict[str, Any] = field(default_factory=dict)
    closed_by: str | None = None
    last_key: str | None = None
    last_digest: str | None = None  #: digest of the body of the last change
    applied_at: float = 0.0


class State:
    def __init__(self) -> None:
        self.config = Config()  #: for accounts without a configuration of their own
        self.accounts: dict[str, Config] = {}
        self.faults: list[Fault] = []
        self.keys: dict[tuple[str, str, str], KeyEntry] = {}
        self.cases: dict[tuple[str, str], Case] = defaultdict(Case)
        self.messages: list[dict[str, Any]] = []
        self.effects: dict[str, int] = defaultdict(int)
        #: effects applied per business act, whatever key carried them: a CRM verb on a
        #: case ("crm:<account>:update:<case>"), an email to a recipient
        #: ("email:<account>:<to>") — two operations for one act show here as 2
        self.by_act: dict[str, int] = defaultdict(int)
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        #: the provider's own durable record of what each key applied: what its status
        #: API answers from, whatever the key store (a cache in front of it) says
        self.applied: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: each account's front door: one per account name, shared by its CRM and its email
        #: API as the account's `Config` is
        self.limiters: dict[str, Limiter] = defaultdict(Limiter)

    def take_fault(
        self, provider: str, key: str | None, *, front_door: bool = False
    ) -> Fault | None:
        """The next armed fault for this request: one of `FRONT_DOOR` at the front door,
        any other mode after it."""
        for fault in self.faults:
            if (
                fault.provider == provider
                and fault.times > 0
                and fault.key in (None, key)
                and (fault.mode in FRONT_DOOR) == front_door
            ):
                fault.times -= 1
                return fault
        return None

    def config_for(self, account: str) -> Config:
        return self.accounts.get(account, self.config)

    def key_entry(self, provider: str, account: str, key: str) -> KeyEntry | None:
        entry = self.keys.get((provider, account, key))
        if entry is not None and time.time() - entry.created > self.config_for(account).retention_s:
            del self.keys[(provider, account, key)]  # pruned: the key is new again
            return None
        return entry


STATE = State()


def _error(status: int, code: str, message: str = "") -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message or code}}


def _without_code(payload: dict[str, Any]) -> dict[str, Any]:
    """An error body as providers without error codes send it: a message and nothing else."""
    error = payload.get("error")
    if isinstance(error, dict):
        return {"message": error.get("message", "request failed")}
    return payload


def _error_response(status: int, code: str, message: str = "") -> JSONResponse:
    status, body = _error(status, code, message)
    return JSONResponse(body, status_code=status)


def _refusal(cfg: Config, status: int, code: str, message: str, wait: str) -> JSONResponse:
    """A "not now" from the front door: nothing was read or applied."""
    _, payload = _error(status, code, message)
    if not cfg.error_codes:
        payload = _without_code(payload)
    return JSONResponse(payload, status_code=status, headers={"Retry-After": wait})


def _front_door(request: Request, state: State, provider: str, account: str) -> Response | None:
    """What answers a write before its key is read: an "overloaded" fault (a 503), or the
    account's limits (a 429); None when the request is admitted and now in flight."""
    cfg, limiter = state.config_for(account), state.limiters[account]
    fault = state.take_fault(provider, request.headers.get("idempotency-key"), front_door=True)
    if fault is not None:
        limiter.overloaded += 1
        return _refusal(cfg, 503, "overloaded", "overloaded, try later", f"{fault.delay_s:g}")
    wait = limiter.admit(cfg, time.time())
    if wait is None:
        return None
    # as real providers send it: whole seconds, at least one, by when a slot or token is free
    seconds = max(1, math.ceil(wait))
    return _refusal(cfg, 429, "rate_limited", "too many requests for this account", str(seconds))


async def _limited(
    request: Request,
    state: State,
    provider: str,
    account: str,
    handle: Callable[[], Awaitable[Response]],
) -> Response:
    """`handle` a write request if the front door admits it. Its place in flight ends when
    the handler has its answer, before the answer is sent: a client that lets its next
    request go once it has read the answer is never counted twice."""
    refused = _front_door(request, state, provider, account)
    if refused is not None:
        return refused
    limiter = state.limiters[account]
    try:
        return await handle()
    finally:
        limiter.release()


class DroppedResponse(Response):
    """Start a response, send part of it, then cut the connection."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"1000"), (b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"partial":', "more_body": True})
        raise ConnectionAbortedError("sandbox fault: response dropped after commit")


async def _keyed_request(
    request: Request,
    state: State,
    provider: str,
    account: str,
    execute: Any,
    *,
    mismatch: tuple[int, str],
    conflict: tuple[int, str],
) -> Response:
    """The idempotency layer shared by the HTTP providers, then faults, then `execute`.

    `state` is the state the request arrived in: a request still executing when the
    sandbox is reset finishes against the old state and leaves the new one alone.
    """
    exchange = await _Exchange.arrive(request, state, provider, account)
    by_key = await exchange.answer_by_key(mismatch, conflict)
    if by_key is not None:
        return by_key
    return await exchange.run(execute)


@dataclass
class _Exchange:
    """One request through the idempotency layer: what it carried, its line in the
    request log (the ground truth's `requests`), and the key entry it holds while it
    executes (None without a key)."""

    state: State
    provider: str
    account: str
    cfg: Config
    body: bytes
    digest: str
    key: str | None
    log: dict[str, Any]
    entry: KeyEntry | None = None

    @classmethod
    async def arrive(cls, request: Request, state: State, provider: str, account: str) -> _Exchange:
        cfg = state.config_for(account)  # as the request arrived
        body = await request.body()
        digest = hashlib.sha256(body).hexdigest()
        key = request.headers.get("idempotency-key")
        peer = f"{request.client.host}:{request.client.port}" if request.client else None
        log = {
            "arrived": time.time(),
            "completed": None,
            "status": None,
            "digest": digest,
            "peer": peer,
        }
        state.requests[f"{provider}:{key}"].append(log)
        return cls(state, provider, account, cfg, body, digest, key, log)

    def finish(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> Response:
        self.log["completed"], self.log["status"] = time.time(), status
        if status >= 400 and not self.cfg.error_codes:
            payload = _without_code(payload)
        return JSONResponse(payload, status_code=status, headers=headers)

    async def answer_by_key(
        self, mismatch: tuple[int, str], conflict: tuple[int, str]
    ) -> Response | None:
        """The answer when the key decides it: a key refused, a payload that differs from
        the key's first one, a concurrent request, a replay. Otherwise None, and the key
        now marks this request as in progress."""
        key, cfg = self.key, self.cfg
        if key is None:
            return None
        if cfg.max_key_length and len(key) > cfg.max_key_length:
            return self.finish(*_error(400, "invalid_idempotency_key", "the key is too long"))
        entry = self.state.key_entry(self.provider, self.account, key)
        if entry is not None and cfg.keys:
            if entry.digest != self.digest and cfg.payload_check:
                return self.finish(*_error(*mismatch, "this key was used with a different payload"))
            if entry.state == "in_progress":
                if cfg.inflight_conflict:
                    if cfg.inflight_wait_s:
                        await asyncio.sleep(cfg.inflight_wait_s)
                    return self.finish(*_error(*conflict, "a request with this key is in progress"))
            else:
                return self.finish(entry.status_code, entry.body, {"Idempotent-Replayed": "true"})
        self.entry = KeyEntry(digest=self.digest, created=time.time())
        self.state.keys[(self.provider, self.account, key)] = self.entry
        return None

    def store(self, status: int, payload: dict[str, Any]) -> None:
        """What the provider remembers of the outcome: its own record of an applied change,
        and the key's stored response (a 5xx released instead, without `replay_errors`)."""
        key, entry = self.key, self.entry
        if key is not None and status < 300:
            self.state.applied[(self.provider, self.account, key)] = {
                "status_code": status,
                "response": payload,
            }
        if entry is not None and (status < 500 or self.cfg.replay_errors):
            entry.state, entry.status_code, entry.body = "done", status, payload
        elif entry is not None:
            self.state.keys.pop((self.provider, self.account, key or ""), None)

    async def run(self, execute: Any) -> Response:
        """`execute` the request, unless a fault fails it first."""
        fault = self.state.take_fault(self.provider, self.key)
        if fault is not None and fault.mode == "error_before_commit":
            status, payload = _error(500, "internal_error", "failed before commit")
            self.store(status, payload)
            return self.finish(status, payload)
        if self.cfg.processing_s:
            await asyncio.sleep(self.cfg.processing_s)
        try:
            payload_in = json.loads(self.body or b"{}")
        except ValueError:
            status, payload = _error(400, "invalid_json")
            self.store(status, payload)
            return self.finish(status, payload)
        status, payload = execute(payload_in, self.key, self.digest)
        if not self.cfg.echo_digest:
            payload = {
                k: v for k, v in payload.items() if k not in ("idempotency_key", "request_digest")
            }
        return await self.after_commit(fault, status, payload)

    async def after_commit(
        self, fault: Fault | None, status: int, payload: dict[str, Any]
    ) -> Response:
        """The answer once `execute` ran, through the faults that strike after the commit."""
        if fault is not None and fault.mode == "error_after_commit" and status < 300:
            self.store(status, payload)  # applied: the provider's own records say so
            status, payload = _error(500, "internal_error", "failed after commit")
        self.store(status, payload)
        if fault is not None and fault.mode == "drop_after_commit":
            self.log["completed"], self.log["status"] = time.time(), "dropped"
            return DroppedResponse()
        if fault is not None and fault.mode == "delay_after_commit":
            await asyncio.sleep(fault.delay_s)
        return self.finish(status, payload)


# -- CRM ------------------------------------------------------------------------------------


async def crm_case_action(request: Request) -> Response:
    state = STATE
    account = request.path_params["account"]
    case_id = request.path_params["case_id"]
    verb = request.path_params["verb"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        case = state.cases[(account, case_id)]
        if case_id.startswith("missing-"):
            return _error(404, "case_not_found", f"no case {case_id}")
        if verb == "close":
            if case.status == "closed":
                return _error(409, "case_already_closed", f"closed by {case.closed_by}")
            case.status, case.closed_by = "closed", "api"
        case.fields.update(payload.get("fields", {}))
        if "note" in payload:
            case.fields["note"] = payload["note"]
        case.version += 1
        case.last_key, case.last_digest, case.applied_at = key, digest, time.time()
        state.effects[f"crm:{key}"] += 1
        state.by_act[f"crm:{account}:{verb}:{case_id}"] += 1
        return 200, {
            "case_id": case_id,
            "status": case.status,
            "version": case.version,
            "idempotency_key": key,
            "request_digest": digest,
        }

    return await _limited(
        request,
        state,
        "crm",
        account,
        lambda: _keyed_request(
            request,
            state,
            "crm",
            account,
            execute,
            mismatch=(422, "idempotency_key_reused"),
            conflict=(409, "idempotency_key_in_use"),
        ),
    )


async def crm_request_status(request: Request) -> Response:
    if not STATE.config_for(request.path_params["account"]).status_api:
        return _error_response(501, "not_supported")
    account, key = request.path_params["account"], request.path_params["key"]
    entry = STATE.key_entry("crm", account, key)
    if entry is not None and entry.state == "in_progress":
        return JSONResponse({"state": "in_progress"}, status_code=202)
    applied = STATE.applied.get(("crm", account, key))
    if applied is not None:  # the change was made, whatever the response said
        return JSONResponse({"state": "done", "applied": True, **applied})
    if entry is None:
        return _error_response(404, "no_such_request")
    return JSONResponse(
        {
            "state": "done",
            "applied": False,
            "status_code": entry.status_code,
            "response": entry.body,
        }
    )


async def crm_get_case(request: Request) -> Response:
    case = STATE.cases[(request.path_params["account"], request.path_params["case_id"])]
    return JSONResponse({"case_id": request.path_params["case_id"], **asdict(case)})


async def crm_search(request: Request) -> Response:
    account, key = request.path_params["account"], request.query_params.get("key")
    horizon = time.time() - STATE.config_for(account).search_lag_s
    hits = [
        {"case_id": case_id, **asdict(case)}
        for (acct, case_id), case in list(STATE.cases.items())
        if acct == account and case.last_key == key and case.applied_at <= horizon
    ]
    return JSONResponse({"results": hits})


async def crm_close_by_other(request: Request) -> Response:
    case = STATE.cases[(request.path_params["account"], request.path_params["case_id"])]
    case.status, case.closed_by, case.version = "closed", "someone-else", case.version + 1
    case.last_key, case.last_digest, case.applied_at = None, None, time.time()
    return JSONResponse(asdict(case))


# -- email over HTTP ------------------------------------------------------------------------


async def email_send(request: Request) -> Response:
    state = STATE
    account = request.path_params["account"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        if not payload.get("to") or "@" not in str(payload.get("to")):
            return _error(422, "validation_error", "a recipient address is required")
        message_id = f"msg_{len(state.messages) + 1:06d}"
        state.messages.append(
            {
                "id": message_id,
                "account": account,
                "marker": payload.get("marker"),
                "key": key,
                "to": payload.get("to"),
                "accepted_at": time.time(),
                "last_event": "accepted",
            }
        )
        state.effects[f"email:{key or payload.get('marker')}"] += 1
        state.by_act[f"email:{account}:{payload.get('to')}"] += 1
        return 202, {"id": message_id}

    return await _limited(
        request,
        state,
        "email",
        account,
        lambda: _keyed_request(
            request,
            state,
            "email",
            account,
            execute,
            mismatch=(409, "invalid_idempotent_request"),
            conflict=(409, "concurrent_idempotent_requests"),
        ),
    )


async def email_sent_search(request: Request) -> Response:
    account, marker = request.path_params["account"], request.query_params.get("marker")
    horizon = time.time() - STATE.config_for(account).search_lag_s
    hits = [
        m
        for m in STATE.messages
        if m["account"] == account and m["marker"] == marker and m["accepted_at"] <= horizon
    ]
    return JSONResponse({"data": hits})


# -- a webhook receiver ---------------------------------------------------------------------


async def webhook_receive(request: Request) -> Response:
    """Counts deliveries per Idempotency-Key; deduplicates by it when keys are on."""
    state = STATE
    name = request.path_params["name"]

    def execute(
        payload: dict[str, Any], key: str | None, digest: str
    ) -> tuple[int, dict[str, Any]]:
        state.effects[f"webhook:{key}"] += 1
        state.messages.append({"webhook": name, "key": key, "payload": payload, "at": time.time()})
        return 200, {"received": True}

    return await _keyed_request(
        request,
        state,
        "webhook",
        name,
        execute,
        mismatch=(422, "idempotency_key_reused"),
        conflict=(409, "in_progress"),
    )


# -- admin ----------------------------------------------------------------------------------


async def admin_truth(request: Request) -> Response:
    return JSONResponse(
        {
            "effects": dict(STATE.effects),
            "by_act": dict(STATE.by_act),
            "requests": {k: v for k, v in STATE.requests.items()},
            "limited": {account: lim.report() for account, lim in STATE.limiters.items()},
        }
    )


async def admin_restart(request: Request) -> Response:
    """The provider restarts: accounts whose key store is not durable forget every key."""
    forgotten = [k for k in STATE.keys if not STATE.config_for(k[1]).keys_durable]
    for k in forgotten:
        del STATE.keys[k]
    return JSONResponse({"ok": True, "keys_forgotten": len(forgotten)})


async def admin_reset(request: Request) -> Response:
    global STATE
    STATE = State()
    return JSONResponse({"ok": True})


async def admin_config(request: Request) -> Response:
    changes = await request.json()
    account = changes.pop("account", None)
    config = STATE.config
    if account is not None:
        config = STATE.accounts.setdefault(account, replace(STATE.config))
    for name, value in changes.items():
        if not hasattr(config, name):
            return _error_response(400, "unknown_setting", name)
        setattr(config, name, type(getattr(config, name))(value))
    return JSONResponse(asdict(config))


async def admin_fault(request: Request) -> Response:
    spec = await request.json()
    if spec.get("mode") not in FAULT_MODES:
        return _error_response(400, "unknown_fault", str(spec.get("mode")))
    if spec["mode"] in FRONT_DOOR and spec.get("provider") not in LIMITED_PROVIDERS:
        return _error_response(
            400, "unknown_fault", f"{spec['mode']} strikes only {', '.join(LIMITED_PROVIDERS)}"
        )
    STATE.faults.append(Fault(**spec))
    return JSONResponse({"ok": True, "pending": len(STATE.faults)})


def build_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/crm/{account}/cases/{case_id}/{verb:str}", crm_case_action, methods=["POST"]),
            Route("/crm/{account}/cases/{case_id}", crm_get_case, methods=["GET"]),
            Route("/crm/{account}/requests/{key}", crm_request_status, methods=["GET"]),
            Route("/crm/{account}/search", crm_search, methods=["GET"]),
            Route("/email/{account}/send", email_send, methods=["POST"]),
            Route("/email/{account}/sent", email_sent_search, methods=["GET"]),
            Route("/webhook/{name}", webhook_receive, methods=["POST"]),
            Route("/_admin/truth", admin_truth, methods=["GET"]),
            Route("/_admin/reset", admin_reset, methods=["POST"]),
            Route("/_admin/restart", admin_restart, methods=["POST"]),
            Route("/_admin/config", admin_config, methods=["POST"]),
            Route("/_admin/faults", admin_fault, methods=["POST"]),
            Route(
                "/_admin/crm/{account}/cases/{case_id}/close_by_other",
                crm_close_by_other,
                methods=["POST"],
            ),
        ]
    )


# -- SMTP -----------------------------------------------------------------------------------


class SmtpHandler:
    """Accepts every message, counts it by Message-ID, and can drop after DATA."""

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        state = STATE
        message = message_from_bytes(envelope.original_content or envelope.content)
        message_id = str(message.get("Message-ID", "")).strip()
        fault = state.take_fault("smtp", message_id)
        if fault is not None and fault.mode in ("refuse_after_data", "defer_after_data"):
            code = 554 if fault.mode == "refuse_after_data" else 451
            state.requests[f"smtp:{message_id}"].append(
                {"arrived": time.time(), "completed": time.time(), "status": code}
            )
            return f"{code} sandbox fault: message not accepted"
        state.effects[f"smtp:{message_id}"] += 1
        state.requests[f"smtp:{message_id}"].append(
            {"arrived": time.time(), "completed": time.time(), "status": 250}
        )
        if fault is not None and fault.mode == "drop_after_data":
            server.transport.close()
        return "250 2.0.0 Message accepted for delivery"
