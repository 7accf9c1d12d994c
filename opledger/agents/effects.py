"""What an agent calls to cause an external effect once, and to learn how it ended.

    effects = Effects(ledger)                      # publishes through opledger's Celery app
    close = effects.effect(tenant="acme", run="onboarding-42",
                           action="crm.close_case.v1", target="case-318",
                           payload={"note": "resolved"}, authorization_ref="auth_acme",
                           asked_by=tool_call_id, wait=30)
    if close.kind == "confirmed":
        effects.effect(..., action="email.send.v1", after=[close], wait=30)

The intent is the workflow run plus the act itself — the action, the target, the action's
declared intent fields and an explicit `purpose` (`opledger.ledger.intents`) — never the
payload's wording and never an id the model or the transport invented (`asked_by` is kept
as evidence of which call asked). Asking for the same act again, whatever new id or
rewording the model chose, returns the operation it recorded and how it stands, never a
second effect; what the new ask asked differently is named in the result (`differs`) and
was not sent. Waiting is `LISTEN opledger_settle` (the ledger NOTIFYs in the transaction
that settles an operation an agent waits on) on one connection per process, however many
agents wait in it (`opledger.agents.listener`), with a slow poll as the fallback; the
answer is read in one statement (`Ledger.answers`), by the listener for every waiter a
batch of notifications wakes. It returns when the operation is final, or when a person
holds it (or holds a dependency it waits on), or when the time is up. Unknown is never
"failed".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from opledger.ledger import (
    Answer,
    Asked,
    Dependency,
    IntentConflict,
    InvalidInput,
    Ledger,
    Operation,
    Review,
    Status,
    dsn,
)
from opledger.ledger.intents import intent_key as derived_intent_key
from opledger.ledger.intents import payload_differences
from opledger.observability import tracing

from .listener import Waiter, listener_for

log = logging.getLogger("opledger.agents")

#: how often a waiter reads the operation again even without a notification
DEFAULT_POLL = 5.0
#: how often it reads when LISTEN is not available (a pooler in transaction mode, say)
FALLBACK_POLL = 0.5

Publish = Callable[[str], None]


class _Result(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    #: the operation as it stands (its id, status, run and intent, target, key...)
    operation: Operation
    #: the intent was recorded before this ask (a replayed step, a model asked again, a
    #: lost answer asked again): this is the recorded operation, and nothing new was sent
    asked_before: bool = False
    #: what this ask asked otherwise than the recorded operation — payload fields as
    #: "payload.<field>" ("payload" once the frozen payload is purged),
    #: "authorization_ref", "after" — none of which was recorded or sent: the `kind` and
    #: everything else here are the recorded operation's, not this ask's
    differs: tuple[str, ...] = ()

    @property
    def op_id(self) -> str:
        return self.operation.id

    @property
    def final(self) -> bool:
        """Confirmed, rejected or cancelled: nothing about it will change any more."""
        return self.operation.status.final

    def _act(self) -> str:
        return f"{self.operation.action} on {self.operation.target}"

    def _state(self) -> str:
        raise NotImplementedError

    @property
    def message(self) -> str:
        """How it stands, in words an agent (or a person) reads."""
        if not self.asked_before:
            return self._state()
        text = (
            f"This run already asked for {self._act()} (operation {self.op_id}); "
            f"{self._state()} Nothing new was sent."
        )
        if self.differs:
            text += (
                f" This call differs from the recorded one in {', '.join(self.differs)}: "
                "that was not sent."
            )
        return text


class EffectConfirmed(_Result):
    """The provider's evidence binds this operation: the effect happened (once)."""

    kind: Literal["confirmed"] = "confirmed"
    #: the provider's receipt (a case version, a message id)
    receipt_id: str | None
    #: the provider only took custody (an email "accepted"), which is not delivery
    accepted_only: bool = False
    #: what the provider said the effect produced (the adapter's `Confirmed.result`: a
    #: case's new status and version, a payment's id and amount, a message id), from the
    #: confirming evidence; a note ({"omitted": why}) where it was too large to keep
    data: dict[str, Any] = {}

    def _state(self) -> str:
        done = (
            "accepted by the provider (custody, not delivery)" if self.accepted_only else ("done")
        )
        receipt = f", receipt {self.receipt_id}" if self.receipt_id else ""
        return f"{self._act()} is {done}{receipt}."


class EffectRejected(_Result):
    """The provider definitively refused this request: the effect did not happen."""

    kind: Literal["rejected"] = "rejected"
    code: str | None
    reason: str

    def _state(self) -> str:
        code = f" ({self.code})" if self.code else ""
        return f"the provider refused {self._act()}{code}: {self.reason}. It did not happen."


class EffectCancelled(_Result):
    """Stopped before any effect: a dependency failed, the grant was revoked, an operator."""

    kind: Literal["cancelled"] = "cancelled"
    reason: str

    def _state(self) -> str:
        return f"{self._act()} was cancelled before any effect: {self.reason}."


class EffectUnknown(_Result):
    """The effect may or may not have happened. Not a failure: evidence (a lookup, a late
    receipt) or a person (the review) will settle it; do not do it again another way."""

    kind: Literal["unknown"] = "unknown"
    #: the open review that holds it, if a person has it
    review: Review | None
    #: what it waits for, in words
    waiting_for: str

    def _state(self) -> str:
        return (
            f"whether {self._act()} happened is not known yet: it may have. Do not do it "
            f"another way; it waits for {self.waiting_for}."
        )


class EffectPending(_Result):
    """Nothing settled yet: it waits for its dependencies, a worker, or the provider's
    answer (when the wait ran out, or when nothing was waited for)."""

    kind: Literal["pending"] = "pending"
    #: what it waits for: its dependencies, a worker to take it, or the provider (its answer
    #: to the attempt under way, or room for it: its limits, a "not now", an outage)
    awaiting: Literal["dependencies", "worker", "provider"]
    #: the same, in words
    waiting_for: str
    #: the dependencies not confirmed yet (each with the review holding it, if any)
    blocked_by: tuple[Dependency, ...] = ()

    def _state(self) -> str:
        return f"{self._act()} is recorded and not settled yet: it waits for {self.waiting_for}."


EffectResult = EffectConfirmed | EffectRejected | EffectCancelled | EffectUnknown | EffectPending


def _default_publish(op_id: str) -> None:
    # through an app named explicitly, from whatever thread or event loop calls it
    from opledger.tasks.app import publish_dispatch

    publish_dispatch(op_id)


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
        self._dsn = dsn.conninfo(ledger.engine.url)  # every host the engine's URL names

    # -- recording ---------------------------------------------------------------------

    def effect(
        self,
        *,
        tenant: str,
        run: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        purpose: str | None = None,
        intent_fields: Sequence[str] | None = None,
        intent_key: str | None = None,
        asked_by: str | None = None,
        after: Sequence[str | _Result] = (),
        wait: float | timedelta | None = None,
    ) -> EffectResult:
        """Record the intent of this act in workflow run `run`, enqueue it, and return how
        it stands — after waiting up to `wait` seconds for it to settle, if given.

        The intent (the operation's `intent_key`) is derived from the act: the action, the
        target, the values of the action's intent fields (`intent_fields`, else what its
        adapter declares, else none) and `purpose` — say one only to ask deliberately for
        the same act again (a second reminder). `intent_key` instead names the intent yourself
        (a key of your workflow's own, stable across re-runs). `asked_by` is the asker's id
        for this call (a tool-call id, a request id): kept as evidence, never the intent.

        Asking again for an act this run already asked for returns its operation as it
        stands (`asked_before`), never a second effect; a payload, authorization or
        `after` that differs is named in `differs` and is not sent (the result's `kind` is
        the recorded operation's). Only where `intent_key=` names an intent that already names
        another action or target does it raise `IntentConflict`: one key cannot name two
        acts. `after` (operation ids or earlier results) makes it wait until each of them
        is confirmed. Raises `IntentFieldsUndeclared` when the ledger was built without the
        adapter registry and neither `intent_fields` nor `intent_key` is given.
        """
        timeout = _timeout(wait)
        asked = self._record(
            tenant,
            run,
            self._intent(action, target, payload, purpose, intent_fields, intent_key),
            action,
            target,
            payload,
            authorization_ref,
            after,
            asked_by,
            publish=timeout is None,
        )
        op_id = asked.operation.id
        if timeout is None:
            result = self.result(op_id)
        else:  # the ask made it NOTIFY (`notify=True`): no `watch` needed
            result = self._wait(op_id, timeout, publish=_publishable(asked), known=_fresh(asked))
        return self._as_asked(result, asked, payload)

    async def aeffect(
        self,
        *,
        tenant: str,
        run: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        purpose: str | None = None,
        intent_fields: Sequence[str] | None = None,
        intent_key: str | None = None,
        asked_by: str | None = None,
        after: Sequence[str | _Result] = (),
        wait: float | timedelta | None = None,
    ) -> EffectResult:
        """`effect` for asyncio agents: the wait never blocks the event loop."""
        timeout = _timeout(wait)
        key = self._intent(action, target, payload, purpose, intent_fields, intent_key)
        asked = await asyncio.to_thread(
            self._record,
            tenant,
            run,
            key,
            action,
            target,
            payload,
            authorization_ref,
            after,
            asked_by,
            publish=timeout is None,
        )
        op_id = asked.operation.id
        if timeout is None:
            result = await asyncio.to_thread(self.result, op_id)
        else:
            result = await self._await(
                op_id, timeout, publish=_publishable(asked), known=_fresh(asked)
            )
        if asked.first:
            return result
        return await asyncio.to_thread(self._as_asked, result, asked, payload)

    def intent_of(
        self,
        *,
        action: str,
        target: str,
        payload: dict[str, Any],
        purpose: str | None = None,
        intent_fields: Sequence[str] | None = None,
    ) -> str:
        """The intent key `effect` records this act under (without `intent_key`)."""
        return self._intent(action, target, payload, purpose, intent_fields, None)

    def _intent(
        self,
        action: str,
        target: str,
        payload: dict[str, Any],
        purpose: str | None,
        intent_fields: Sequence[str] | None,
        own_key: str | None,
    ) -> str:
        if own_key is not None:
            if purpose is not None:
                raise InvalidInput(
                    "give either intent_key (your own) or purpose, not both",
                    field="purpose",
                )
            return own_key
        fields = self.ledger.intent_fields(action) if intent_fields is None else intent_fields
        return derived_intent_key(action, target, payload, fields=fields, purpose=purpose)

    def _record(
        self,
        tenant: str,
        run: str,
        key: str,
        action: str,
        target: str,
        payload: dict[str, Any],
        authorization_ref: str,
        after: Sequence[str | _Result],
        asked_by: str | None,
        *,
        publish: bool,
    ) -> Asked:
        """Ask for the act; with `publish`, also enqueue its dispatch when it is ready
        (else the caller publishes it once it listens for the answer)."""
        with tracing.prepare(tenant, action) as span:  # the publish span is its child
            asked = self.ledger.ask(
                tenant=tenant,
                workflow_id=run,
                intent_key=key,
                action=action,
                target=target,
                payload=payload,
                authorization_ref=authorization_ref,
                after=_ids(after),
                notify=True,
                actor="agent",
                asked_by=asked_by,
                traceparent=span.traceparent(),
            )
            op = asked.operation
            span.prepared(op)
            if publish and _publishable(asked):
                self._try_publish(op.id)
        return asked

    def _as_asked(
        self, result: EffectResult, asked: Asked, payload: dict[str, Any]
    ) -> EffectResult:
        """The result as the answer to this ask: whether the intent was recorded before,
        and what this ask asked differently (payload fields named)."""
        if asked.first:
            return result
        clash = [part for part in asked.differs if part in ("action", "target")]
        if clash:  # only an intent key of the caller's own (`intent_key=`) can name two acts
            op = asked.operation
            raise IntentConflict(
                f"intent {op.intent_key!r} of workflow {op.workflow_id!r} already names "
                f"operation {op.id} ({op.action} on {op.target}) with a different "
                f"{', '.join(clash)}: another act needs another intent key",
                op_id=op.id,
                differs=tuple(asked.differs),
            )
        differs: list[str] = []
        for part in asked.differs:
            if part != "payload_digest":
                differs.append(part)
                continue
            recorded = self.ledger.payload(asked.operation.id)
            if recorded is None:  # purged after its retention: the digest says it differs
                differs.append("payload")
            else:
                differs.extend(f"payload.{f}" for f in payload_differences(recorded, payload))
        return result.model_copy(update={"asked_before": True, "differs": tuple(differs)})

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
        """How `op_id` stands now, as a result an agent can reason on (one statement)."""
        return _result_of(self.ledger.answer(op_id))

    def wait(self, op_id: str, timeout: float) -> EffectResult:
        """Wait up to `timeout` seconds for `op_id` to settle (see `settled`); how it stands.

        Woken through this process's one listening connection (`listener_for`: the
        ledger's NOTIFY, within milliseconds of the settling commit), which reads the
        answer for it; reads again every `poll` seconds in case a notification was missed
        (every `FALLBACK_POLL` while that connection is down)."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        return self._wait(op_id, timeout, watch=True)

    async def await_result(self, op_id: str, timeout: float) -> EffectResult:
        """`wait` for asyncio: the same listening connection wakes the task (with its
        answer read); its own reads run in a worker thread."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        return await self._await(op_id, timeout, watch=True)

    def _waiter(self, op_id: str, publish: bool = False) -> Waiter:
        """A waiter on `op_id`, answered by the listener (one statement per batch); with
        `publish`, the dispatch is published as soon as the waiter is registered."""
        return listener_for(self._dsn).watch(
            {op_id},
            subject=op_id,
            read=self.ledger.answers,
            then=(lambda: self._try_publish(op_id)) if publish else None,
        )

    def _wait(
        self,
        op_id: str,
        timeout: float,
        *,
        watch: bool = False,
        publish: bool = False,
        known: EffectResult | None = None,
    ) -> EffectResult:
        """The wait: its waiter registered first, then its dispatch published (`publish`);
        `watch` has it NOTIFY; how it stands is `known` when the caller knows it (just
        recorded, and the listener was listening before the dispatch went out), else read."""
        deadline = time.monotonic() + timeout
        with self._waiter(op_id, publish) as waiter:
            if watch:
                self.ledger.watch(op_id)  # after the waiter listens: no settle falls between
            result = known if known is not None and waiter.heard else self.result(op_id)
            published = publish
            while not at_rest(result):
                waiter.watch(_watched(result))
                published = self._publish_released(result, published)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                waiter.wait(min(remaining, self._interval()))
                result = self._answered(waiter, op_id)
            return result

    async def _await(
        self,
        op_id: str,
        timeout: float,
        *,
        watch: bool = False,
        publish: bool = False,
        known: EffectResult | None = None,
    ) -> EffectResult:
        """`_wait` for asyncio."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        waiter = await asyncio.to_thread(self._waiter, op_id, publish)
        with waiter:
            if watch:
                await asyncio.to_thread(self.ledger.watch, op_id)
            if known is None or not waiter.heard:
                result = await asyncio.to_thread(self.result, op_id)
            else:
                result = known
            published = publish
            while not at_rest(result):
                waiter.watch(_watched(result))
                published = self._publish_released(result, published)
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await waiter.await_(min(remaining, self._interval()))
                answer = waiter.answer()
                if answer is not None:
                    result = _result_of(answer)
                else:
                    result = await asyncio.to_thread(self.result, op_id)
            return result

    def _answered(self, waiter: Waiter, op_id: str) -> EffectResult:
        """How `op_id` stands after a wake: the answer the listener read for it, else read
        now (a poll, or a wake of everyone after the listener reconnected)."""
        answer = waiter.answer()
        return _result_of(answer) if answer is not None else self.result(op_id)

    def _interval(self) -> float:
        """How long a waiter sleeps at most between two reads: its poll, or the fallback
        poll while this process is not listening."""
        if listener_for(self._dsn).listening:
            return self.poll
        return min(self.poll, FALLBACK_POLL)

    def _publish_released(self, result: EffectResult, published: bool) -> bool:
        """A dependent whose dependencies are all confirmed now is published by its
        waiter at once (the relay would, within a sweep interval)."""
        if (
            not published
            and isinstance(result, EffectPending)
            and result.operation.status is Status.PREPARED
            and result.awaiting == "worker"
        ):
            self._try_publish(result.op_id)
            return True
        return published


def at_rest(result: EffectResult) -> bool:
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


def _publishable(asked: Asked) -> bool:
    """Whether the asked operation is ready for a worker (prepared, waiting on nothing)."""
    op = asked.operation
    return op.status is Status.PREPARED and not op.waiting_on


def _fresh(asked: Asked) -> EffectResult | None:
    """How an operation this ask has just recorded stands, without reading it again:
    prepared, waiting for a worker (nothing else can have moved it before its dispatch
    is published). None for anything else (asked before, or waiting on dependencies)."""
    if not (asked.first and _publishable(asked)):
        return None
    return EffectPending(
        operation=asked.operation, awaiting="worker", waiting_for="a worker to take it"
    )


def _result_of(answer: Answer) -> EffectResult:
    op = answer.operation
    last = answer.last_reason if answer.last_reason is not None else op.status.value
    detail = answer.settled_detail
    if op.status is Status.CONFIRMED:
        data = detail.get("result")
        return EffectConfirmed(
            operation=op,
            receipt_id=op.provider_result_id,
            accepted_only=bool(detail.get("accepted_only")),
            data=data if isinstance(data, dict) else {},
        )
    if op.status is Status.REJECTED:
        return EffectRejected(
            operation=op,
            code=detail.get("code"),
            reason=str(detail.get("reason") or last),
        )
    if op.status is Status.CANCELLED:
        return EffectCancelled(operation=op, reason=last)
    if op.status is Status.UNKNOWN:
        review = answer.open_review
        if review is not None:
            waiting = f"a person: review {review.id} ({review.reason})"
        elif op.next_check_at is not None:
            waiting = f"evidence: the next check at {op.next_check_at.isoformat()}"
        else:
            waiting = "evidence: a check is under way"
        return EffectUnknown(operation=op, review=review, waiting_for=waiting)
    blocked = answer.blocked_by
    on: Literal["dependencies", "worker", "provider"]
    if blocked:
        on, waiting = "dependencies", "dependencies: " + "; ".join(_describe(d) for d in blocked)
    elif op.status is Status.DISPATCHING:
        on, waiting = "provider", "the provider's answer to the attempt under way"
    elif op.next_check_at is not None:  # left for later: its provider had no room
        on = "provider"
        waiting = (
            f'room at {op.provider} (its limits, a "not now" or an outage): tried again '
            f"at {op.next_check_at.isoformat()}"
        )
    else:
        on, waiting = "worker", "a worker to take it"
    return EffectPending(operation=op, awaiting=on, waiting_for=waiting, blocked_by=blocked)


def _describe(dep: Dependency) -> str:
    text = f"{dep.op_id} ({dep.action} {dep.target}) is {dep.status}"
    if dep.review_id is not None:
        text += f", held by review {dep.review_id}: {dep.review_reason}"
    return text
