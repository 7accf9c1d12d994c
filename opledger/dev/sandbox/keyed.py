"""What every write to the sandbox's HTTP providers passes through: the front door (an
"overloaded" fault, the account's limits) and the idempotency layer (the key, a replay,
a concurrent request, the faults before and after the commit), then the provider's own
`execute`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from .state import Config, Fault, KeyEntry, State


def error(status: int, code: str, message: str = "") -> tuple[int, dict[str, Any]]:
    return status, {"error": {"code": code, "message": message or code}}


def without_code(payload: dict[str, Any]) -> dict[str, Any]:
    """An error body as providers without error codes send it: a message and nothing else."""
    error = payload.get("error")
    if isinstance(error, dict):
        return {"message": error.get("message", "request failed")}
    return payload


def error_response(status: int, code: str, message: str = "") -> JSONResponse:
    status, body = error(status, code, message)
    return JSONResponse(body, status_code=status)


def _refusal(cfg: Config, status: int, code: str, message: str, wait: str) -> JSONResponse:
    """A "not now" from the front door: nothing was read or applied."""
    _, payload = error(status, code, message)
    if not cfg.error_codes:
        payload = without_code(payload)
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


async def limited(
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


async def keyed_request(
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
            payload = without_code(payload)
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
            return self.finish(*error(400, "invalid_idempotency_key", "the key is too long"))
        entry = self.state.key_entry(self.provider, self.account, key)
        if entry is not None and cfg.keys:
            if entry.digest != self.digest and cfg.payload_check:
                return self.finish(*error(*mismatch, "this key was used with a different payload"))
            if entry.state == "in_progress":
                if cfg.inflight_conflict:
                    if cfg.inflight_wait_s:
                        await asyncio.sleep(cfg.inflight_wait_s)
                    return self.finish(*error(*conflict, "a request with this key is in progress"))
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
            status, payload = error(500, "internal_error", "failed before commit")
            self.store(status, payload)
            return self.finish(status, payload)
        if self.cfg.processing_s:
            await asyncio.sleep(self.cfg.processing_s)
        try:
            payload_in = json.loads(self.body or b"{}")
        except ValueError:
            status, payload = error(400, "invalid_json")
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
            status, payload = error(500, "internal_error", "failed after commit")
        self.store(status, payload)
        if fault is not None and fault.mode == "drop_after_commit":
            self.log["completed"], self.log["status"] = time.time(), "dropped"
            return DroppedResponse()
        if fault is not None and fault.mode == "delay_after_commit":
            await asyncio.sleep(fault.delay_s)
        return self.finish(status, payload)
