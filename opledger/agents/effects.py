"""What an agent calls to cause an external effect once, and to learn how it ended.

    effects = Effects(ledger)                      # publishes through opledger's Celery app
    close = effects.effect(tenant="acme", run="onboarding-42", step="close-case",
                           action="crm.close_case.v1", target="case-318",
                           payload={"note": "resolved"}, authorization_ref="auth_acme",
                           wait=30)
    if close.kind == "confirmed":
        effects.effect(..., step="email-owner", after=[close], wait=30)

The intent is the workflow run and the step (`workflow_id=run`, `intent_key=step`), never
the payload: replaying a step returns the operation it recorded and how it stands now,
never a second effect. Waiting is `LISTEN opledger_settle` (the ledger NOTIFYs in the
transaction that settles an operation an agent waits on), with a slow poll as the
fallback; it returns when the operation is final, or when a person holds it (or holds a
dependency it waits on), or when the time is up. Unknown is never "failed".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Literal

import psycopg
from pydantic import BaseModel, ConfigDict
from sqlalchemy.engine import make_url

from opledger.ledger import (
    Dependency,
    History,
    InvalidInput,
    Ledger,
    Operation,
    Review,
    Status,
)
from opledger.observability import tracing

log = logging.getLogger("opledger.agents")

#: the channel the ledger NOTIFYs on (migration 0008); the payload is the operation id
CHANNEL = "opledger_settle"
#: how often a waiter reads the operation again even without a notification
DEFAULT_POLL = 5.0
#: how often it reads when LISTEN is not available (a pooler in transaction mode, say)
FALLBACK_POLL = 0.5

Publish = Callable[[str], None]


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the operation as it stands (its id, status, run and step, target, attempts' key...)
    operation: Operation

    @property
    def op_id(self) -> str:
        return self.operation.id

    @property
    def final(self) -> bool:
        """Confirmed, rejected or cancelled: nothing about it will change any more."""
        return self.operation.status.final


class EffectConfirmed(_Result):
    """The provider's evidence binds this operation: the effect happened (once)."""

    kind: Literal["confirmed"] = "confirmed"
    #: the provider's receipt (a case version, a message id)
    receipt_id: str | None
    #: the provider only took custody (an email "accepted"), which is not delivery
    accepted_only: bool = False


class EffectRejected(_Result):
    """The provider definitively refused this request: the effect did not happen."""

    kind: Literal["rejected"] = "rejected"
    code: str | None
    reason: str


class EffectCancelled(_Result):
    """Stopped before any effect: a dependency failed, the grant was revoked, an operator."""

    kind: Literal["cancelled"] = "cancelled"
    reason: str


class EffectUnknown(_Result):
    """The effect may or may not have happened. Not a failure: evidence (a lookup, a late
    receipt) or a person (the review) will settle it; do not do it again another way."""

    kind: Literal["unknown"] = "unknown"
    #: the open review that holds it, if a person has it
    review: Review | None
    #: what it waits for, in words
    waiting_for: str


class EffectPending(_Result):
    """Nothing settled yet: it waits for its dependencies, a worker, or the provider's
    answer (when the wait ran out, or when nothing was waited for)."""

    kind: Literal["pending"] = "pending"
    waiting_for: str
    #: the dependencies not confirmed yet (each with the review holding it, if any)
    blocked_by: tuple[Dependency, ...] = ()


EffectResult = EffectConfirmed | EffectRejected | EffectCancelled | EffectUnknown | EffectPending


def _default_publish(op_id: str) -> None:
    from opledger.tasks.app import dispatch

    dispatch.delay(op_id)


class Effects:
    """The agent-facing API over one ledger. Thread-safe; one per process is enough.

    `publish(op_id)` enqueues the dispatch of a prepared operation (default: opledger's
    Celery `dispatch` task, which needs `OPLEDGER_BROKER_URL`). A failed publish is
    logged, not raised: the operation is recorded, and the beat relay publishes it.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        publish: Publish | None = None,
        poll: float = DEFAULT_POLL,
    ) -> None:
        if poll <= 0:
            raise InvalidInput("poll must be a positive number of seconds", field="poll")
        self.ledger = ledger
        self._publish = publish if publish is not None else _default_publish
        self.poll = poll
        url = make_url(ledger.engine.url).set(drivername="postgresql")
        self._dsn = url.render_as_string(hide_password=False)

    # -- recording ---------------------------------------------------------------------

    def effect(
        self,
        *,
        tenant: str,
        run: str,
        step: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        after: Sequence[str | _Result] = (),
        wait: float | timedelta | None = None,
    ) -> EffectResult:
        """Record the intent of `step` in workflow run `run`, enqueue it, and return how it
        stands — after waiting up to `wait` seconds for it to settle, if given.

        Replaying the same step returns the same operation and its current state; the same
        step with another action, target, payload, authorization or `after` raises
        `IntentConflict`: a changed recipient is a new step. `after` (operation ids or
        earlier results) makes it wait until each of them is confirmed.
        """
        timeout = _timeout(wait)
        op = self._record(tenant, run, step, action, target, payload, authorization_ref, after)
        if timeout is None:
            return self.result(op.id)
        return self.wait(op.id, timeout)

    async def aeffect(
        self,
        *,
        tenant: str,
        run: str,
        step: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        after: Sequence[str | _Result] = (),
        wait: float | timedelta | None = None,
    ) -> EffectResult:
        """`effect` for asyncio agents: the wait never blocks the event loop."""
        timeout = _timeout(wait)
        op = await asyncio.to_thread(
            self._record, tenant, run, step, action, target, payload, authorization_ref, after
        )
        if timeout is None:
            return await asyncio.to_thread(self.result, op.id)
        return await self.await_result(op.id, timeout)

    def _record(
        self,
        tenant: str,
        run: str,
        step: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        after: Sequence[str | _Result],
    ) -> Operation:
        with tracing.prepare(tenant, action) as span:  # the publish span is its child
            op = self.ledger.prepare(
                tenant=tenant,
                workflow_id=run,
                intent_key=step,
                action=action,
                target=target,
                payload=payload,
                authorization_ref=authorization_ref,
                after=_ids(after),
                notify=True,
                actor="agent",
                traceparent=span.traceparent(),
            )
            span.prepared(op)
            if op.status is Status.PREPARED and not (
                after and any(d.blocking for d in self.ledger.dependencies(op.id))
            ):
                self._try_publish(op.id)
        return op

    def _try_publish(self, op_id: str) -> None:
        try:
            self._publish(op_id)
        except Exception as exc:  # kombu/redis errors differ by transport
            log.warning(
                "%s is recorded but its dispatch could not be published (%s: %s); the relay "
                "will publish it",
                op_id,
                type(exc).__name__,
                exc,
            )

    # -- reading -----------------------------------------------------------------------

    def result(self, op_id: str) -> EffectResult:
        """How `op_id` stands now, as a result an agent can reason on."""
        history = self.ledger.history(op_id)
        deps = self.ledger.dependencies(op_id)
        return _result_of(history, deps)

    def wait(self, op_id: str, timeout: float) -> EffectResult:
        """Wait up to `timeout` seconds for `op_id` to settle (see `settled`); how it stands.

        Woken by the ledger's NOTIFY (within milliseconds of the settling commit), and
        reads again every `poll` seconds in case a notification was missed."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        deadline = time.monotonic() + timeout
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            log.warning("cannot LISTEN (%s); polling every %ss instead", exc, FALLBACK_POLL)
            return self._poll(op_id, deadline)
        with conn:
            conn.execute(f"LISTEN {CHANNEL}")
            self.ledger.watch(op_id)  # after LISTEN: no settle can fall between the two
            result = self.result(op_id)
            watched = _watched(result)
            published = False
            while not settled(result):
                published = self._publish_released(result, published)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                _next_notice(conn, watched, min(remaining, self.poll))
                result = self.result(op_id)
            return result

    def _poll(self, op_id: str, deadline: float) -> EffectResult:
        result = self.result(op_id)
        published = False
        while not settled(result) and time.monotonic() < deadline:
            published = self._publish_released(result, published)
            time.sleep(max(0.0, min(FALLBACK_POLL, deadline - time.monotonic())))
            result = self.result(op_id)
        return result

    async def await_result(self, op_id: str, timeout: float) -> EffectResult:
        """`wait` for asyncio: LISTEN on an async connection, reads in a worker thread."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
        async with conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            await asyncio.to_thread(self.ledger.watch, op_id)
            result = await asyncio.to_thread(self.result, op_id)
            watched = _watched(result)
            published = False
            while not settled(result):
                published = self._publish_released(result, published)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                wake = loop.time() + min(remaining, self.poll)
                async for notice in conn.notifies(timeout=min(remaining, self.poll)):
                    if notice.payload in watched or loop.time() >= wake:
                        break
                result = await asyncio.to_thread(self.result, op_id)
            return result

    def _publish_released(self, result: EffectResult, published: bool) -> bool:
        """A dependent whose dependencies are all confirmed now is published by its
        waiter at once (the relay would, within a sweep interval)."""
        if (
            not published
            and isinstance(result, EffectPending)
            and result.operation.status is Status.PREPARED
            and not result.blocked_by
            and result.waiting_for.startswith("a worker")
        ):
            self._try_publish(result.op_id)
            return True
        return published


def settled(result: EffectResult) -> bool:
    """Whether waiting longer is pointless: it is final, or a person holds it, or it waits
    on a dependency a person holds (or that can no longer be confirmed)."""
    if result.final:
        return True
    if isinstance(result, EffectUnknown):
        return result.review is not None
    if not isinstance(result, EffectPending):
        return True
    return any(
        d.review_id is not None or d.status in (Status.REJECTED, Status.CANCELLED)
        for d in result.blocked_by
    )


def _next_notice(conn: psycopg.Connection[Any], watched: set[str], timeout: float) -> None:
    """Return at the first notification about a watched operation, or after `timeout`."""
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        for notice in conn.notifies(timeout=left, stop_after=1):
            if notice.payload in watched:
                return


def _watched(result: EffectResult) -> set[str]:
    ids = {result.op_id}
    if isinstance(result, EffectPending):
        ids.update(d.op_id for d in result.blocked_by)
    return ids


def _timeout(wait: float | timedelta | None) -> float | None:
    if wait is None:
        return None
    seconds = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)
    if not seconds >= 0:  # also refuses NaN
        raise InvalidInput("wait must be a non-negative number of seconds", field="wait")
    return seconds


def _ids(after: Iterable[str | _Result]) -> tuple[str, ...]:
    if isinstance(after, str | _Result):
        raise InvalidInput("after must be a list of operations, not one", field="after")
    ids = []
    for item in after:
        if isinstance(item, _Result):
            ids.append(item.op_id)
        elif isinstance(item, str):
            ids.append(item)
        else:
            raise InvalidInput(
                f"after names operations by id or by result, not {type(item).__name__}",
                field="after",
            )
    return tuple(ids)


def _result_of(history: History, deps: Sequence[Dependency]) -> EffectResult:
    op = history.operation
    last = history.transitions[-1].reason if history.transitions else op.status.value
    if op.status is Status.CONFIRMED:
        applied = [e for e in history.evidence if e.applied and e.verdict == "confirmed"]
        accepted = bool(applied and applied[-1].detail.get("accepted_only"))
        return EffectConfirmed(
            operation=op, receipt_id=op.provider_result_id, accepted_only=accepted
        )
    if op.status is Status.REJECTED:
        applied = [e for e in history.evidence if e.applied and e.verdict == "rejected"]
        detail = applied[-1].detail if applied else {}
        return EffectRejected(
            operation=op,
            code=detail.get("code"),
            reason=str(detail.get("reason") or last),
        )
    if op.status is Status.CANCELLED:
        return EffectCancelled(operation=op, reason=last)
    if op.status is Status.UNKNOWN:
        review = next((r for r in reversed(history.reviews) if r.resolved_at is None), None)
        if review is not None:
            waiting = f"a person: review {review.id} ({review.reason})"
        elif op.next_check_at is not None:
            waiting = f"evidence: the next check at {op.next_check_at.isoformat()}"
        else:
            waiting = "evidence: a check is under way"
        return EffectUnknown(operation=op, review=review, waiting_for=waiting)
    blocked = tuple(d for d in deps if d.blocking)
    if blocked:
        waiting = "dependencies: " + "; ".join(_describe(d) for d in blocked)
    elif op.status is Status.DISPATCHING:
        waiting = "the provider's answer to the attempt under way"
    else:
        waiting = "a worker to take it"
    return EffectPending(operation=op, waiting_for=waiting, blocked_by=blocked)


def _describe(dep: Dependency) -> str:
    text = f"{dep.op_id} ({dep.action} {dep.target}) is {dep.status}"
    if dep.review_id is not None:
        text += f", held by review {dep.review_id}: {dep.review_reason}"
    return text
