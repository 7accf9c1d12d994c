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
as evidence of which call asked). An action whose act is the tenant's (its declared intent
scope: a refund of one charge, closing one case) leaves the run out: the same act asked
from any run of the tenant is one act, answered with the run that asked it first. Asking
for the same act again, whatever new id or rewording the model chose, returns the
operation it recorded and how it stands, never a second effect; what the new ask asked
differently is named in the result (`differs`) and was not sent. Waiting is `LISTEN
opledger_settle` (the ledger NOTIFYs in the transaction that settles an operation an agent
waits on) on one connection per process, however many agents wait in it
(`opledger.agents.listener`), with a slow poll as the fallback; the answer is read in one
statement (`Ledger.answers`), by the listener for every waiter a batch of notifications
wakes. It returns when the operation is final, or when a person holds it (or holds a
dependency it waits on), or when the time is up. Unknown is never "failed".
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, cast

from opledger.ledger import (
    Answer,
    Asked,
    IntentConflict,
    InvalidInput,
    Status,
    UnknownAction,
)
from opledger.ledger.connector import conninfo
from opledger.ledger.facades import IntentLedger, WorkerLedger
from opledger.ledger.ids import check_key
from opledger.ledger.intents import Intent, act_key, payload_differences
from opledger.observability import tracing

from .answers import beat_missing_after, waits_for_beat
from .blocking import Body, Call, Sleep, arun, run
from .inline import Inline, configured

if TYPE_CHECKING:
    from opledger.tasks.results import StepResult
from .listener import Waiter, listener_for
from .results import (
    EffectCancelled,
    EffectConfirmed,
    EffectPending,
    EffectRejected,
    EffectResult,
    EffectUnknown,
    _Result,
    at_rest,
    result_of,
    watched,
)

__all__ = [
    "DEFAULT_POLL",
    "FALLBACK_POLL",
    "EffectCancelled",
    "EffectConfirmed",
    "EffectPending",
    "EffectRejected",
    "EffectResult",
    "EffectUnknown",
    "Effects",
    "at_rest",
]

log = logging.getLogger("opledger.agents")

#: how often a waiter reads the operation again even without a notification
DEFAULT_POLL = 5.0
#: how often it reads when LISTEN is not available (a pooler in transaction mode, say)
FALLBACK_POLL = 0.5

Publish = Callable[[str], None]
#: how a call dispatched its act (the result's `path`)
Path = Literal["inline", "worker"]
#: the path an inline dispatch's step says ran: claimed here (and sent, or fenced out
#: after sending); left for a worker (no room at its provider yet, quarantined); none
#: (another took it first, its grant was revoked)
_PATHS: dict[str, Path | None] = {
    "dispatched": "inline",
    "fenced": "inline",
    "busy": "worker",
    "quarantined": "worker",
}


def _default_publish(op_id: str) -> None:
    # through an app named explicitly, from whatever thread or event loop calls it
    from opledger.tasks.app import publish_dispatch

    publish_dispatch(op_id)


class Effects:
    """The agent-facing API over one ledger: a `Ledger`, or anything that is an
    `IntentLedger` (`opledger.ledger.facades`). Thread-safe; one per process is enough.

    `publish(op_id)` enqueues the dispatch of a prepared operation (default: opledger's
    Celery `dispatch` task, which needs `OPLEDGER_BROKER_URL`). A failed publish is
    logged, not raised: the operation is recorded, and the beat relay publishes it.

    `inline` dispatches ready acts in the calling thread instead, under the same fenced
    claim a worker takes (`opledger.agents.inline`): True for every action, action
    patterns (`["crm.*"]`) for some, False for none, even when a call asks; an `Inline`
    as built; None (the default) as `OPLEDGER_INLINE_DISPATCH` says (`off`: only calls
    that ask, `inline=True`). It needs the ledger built with its adapters
    (`Ledger.from_url(url, actions=load_registry(settings))`).
    """

    def __init__(
        self,
        ledger: IntentLedger,
        *,
        publish: Publish | None = None,
        poll: float = DEFAULT_POLL,
        inline: bool | Iterable[str] | Inline | None = None,
    ) -> None:
        if poll <= 0:
            raise InvalidInput("poll must be a positive number of seconds", field="poll")
        self.ledger = ledger
        self._publish = publish if publish is not None else _default_publish
        self.poll = poll
        #: how ready acts are dispatched in this process (None: never; `inline`)
        self.inline: Inline | None = configured(ledger, inline, self._try_publish)
        self._dsn = conninfo(ledger.engine)  # every host the engine's URL names
        self._beat_missing_after = beat_missing_after()

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
        inline: bool | None = None,
    ) -> EffectResult:
        """Record the intent of this act in workflow run `run`, enqueue it, and return how
        it stands — after waiting up to `wait` seconds for it to settle, if given.

        The intent (the operation's `intent_key`) is derived from the act: the action, the
        target, the values of the action's intent fields (`intent_fields`, else what its
        adapter declares, else none) and `purpose` — say one only to ask deliberately for
        the same act again (a second reminder). `intent_key` instead names the intent yourself
        (a key of your workflow's own, stable across re-runs). `asked_by` is the asker's id
        for this call (a tool-call id, a request id): kept as evidence, never the intent.

        Asking again for an act this run already asked for — or, for an action of the
        tenant's scope, any run of the tenant (`first_asked_in` names it) — returns its
        operation as it stands (`asked_before`), never a second effect; a payload, authorization or
        `after` that differs is named in `differs` and is not sent (the result's `kind` is
        the recorded operation's). Only where `intent_key=` names an intent that already names
        another action or target does it raise `IntentConflict`: one key cannot name two
        acts. `after` (operation ids or earlier results) makes it wait until each of them
        is confirmed. Raises `IntentFieldsUndeclared` when the ledger was built without the
        adapter registry and neither `intent_fields` nor `intent_key` is given.

        `inline=True` claims and sends the act in this thread if it can (see `Effects`),
        `False` hands it to a worker; None does as this `Effects` does for its action. The
        result's `path` says which ran.
        """
        timeout = _timeout(wait)
        intent = Intent(
            tenant=tenant,
            workflow_id=run,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            purpose=purpose,
            intent_fields=intent_fields,
            intent_key=intent_key,
            asked_by=asked_by,
            after=_ids(after),
        )
        return self.ask(intent, wait=timeout, inline=inline)

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
        inline: bool | None = None,
    ) -> EffectResult:
        """`effect` for asyncio agents: the wait never blocks the event loop."""
        timeout = _timeout(wait)
        intent = Intent(
            tenant=tenant,
            workflow_id=run,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=authorization_ref,
            purpose=purpose,
            intent_fields=intent_fields,
            intent_key=intent_key,
            asked_by=asked_by,
            after=_ids(after),
        )
        return await self.aask(intent, wait=timeout, inline=inline)

    def ask(
        self, intent: Intent, *, wait: float | timedelta | None = None, inline: bool | None = None
    ) -> EffectResult:
        """`effect` for an `Intent` record (its `after` as operation ids), the one path of
        every agent surface: the LangGraph tools and the MCP gateway build the record."""
        return run(self._effect(intent, _timeout(wait), self._inline_for(intent, inline)))

    async def aask(
        self, intent: Intent, *, wait: float | timedelta | None = None, inline: bool | None = None
    ) -> EffectResult:
        """`ask` for asyncio agents: the wait never blocks the event loop (an inline
        dispatch runs in a worker thread)."""
        return await arun(self._effect(intent, _timeout(wait), self._inline_for(intent, inline)))

    def _inline_for(self, intent: Intent, asked: bool | None) -> Inline | None:
        """The inline dispatch this act would take if it is ready, or None (a worker)."""
        if self.inline is None or asked is False:
            return None
        if asked is None and not self.inline.covers(intent.action):
            return None
        return self.inline

    def intent_of(
        self,
        *,
        action: str,
        target: str,
        payload: dict[str, Any],
        purpose: str | None = None,
        intent_fields: Sequence[str] | None = None,
    ) -> str:
        """The intent key `effect` records this act under (without `intent_key`), in the
        action's scope."""
        return act_key(
            action,
            target,
            payload,
            declared=self.ledger.intent_fields,
            fields=intent_fields,
            purpose=purpose,
            scoped=self.ledger.intent_scope,
        )

    def _effect(
        self, intent: Intent, timeout: float | None, inline: Inline | None
    ) -> Body[EffectResult]:
        """The body of `effect` and `aeffect`: record the act, dispatch it here if `inline`
        can, then how it stands (after the wait, with `timeout`), as the answer to this
        ask."""
        deadline = None if timeout is None else time.monotonic() + timeout
        # an act this call may send itself is not made to NOTIFY: nobody need wait for it
        notify = inline is None
        asked: Asked = yield Call(self._record, intent, timeout is None and notify, notify)
        op_id = asked.operation.id
        path: Path | None = "worker" if _publishable(asked) else None
        result: EffectResult
        if path is not None and inline is not None:
            step = yield Call(self._dispatch_inline, inline, op_id, intent.action, deadline)
            if step is not None:
                path = _PATHS.get(step.action)
                result = yield from self._after_inline(op_id, step, deadline)
            else:  # a worker sends it: published now
                result = yield from self._handed(op_id, deadline)
        elif timeout is None:
            result = yield Call(self.result, op_id)
        else:  # with `notify`, the ask made it NOTIFY; else it is watched now
            fresh = _fresh(asked)
            result = yield from self._waiting(
                op_id, timeout, watch=not notify, publish=_publishable(asked), known=fresh
            )
        if path is not None:
            result = result.model_copy(update={"path": path})
        if not asked.first:
            result = yield Call(self._as_asked, result, asked, intent)
        return result

    def _dispatch_inline(
        self, inline: Inline, op_id: str, action: str, deadline: float | None
    ) -> StepResult | None:
        """Claim and send `op_id` in this thread, as a worker would: what the step did;
        None when this process cannot (then a worker does: see `Inline.why_not`), or no
        slot came in time (`Inline.dispatch`)."""
        ledger = cast(WorkerLedger, self.ledger)
        why = inline.why_not(ledger, action)
        step = None
        if why is None:
            wait = None if deadline is None else deadline - time.monotonic()
            step = inline.dispatch(ledger, op_id, wait=wait)
            if step is None:
                why = f"no inline slot came free in time ({inline.concurrency} in use)"
        if why is not None:
            log.info("%s is sent by a worker, not inline: %s", op_id, why)
            self.ledger.watch(op_id)  # its settle NOTIFYs, as an ask with `notify` would
        return step

    def _after_inline(
        self, op_id: str, step: StepResult, deadline: float | None
    ) -> Body[EffectResult]:
        """How an act dispatched in this process stands: the answer of the outcome that
        settled it, else read; while it is not at rest (unknown, deferred for its
        provider's room), waited on as any other, within what is left of the wait."""
        result: EffectResult
        if step.answer is not None:
            result = self._result_of(step.answer)
        else:
            result = yield Call(self.result, op_id)
        if deadline is None or at_rest(result):
            return result
        waited: EffectResult = yield from self._waiting(
            op_id, max(0.0, deadline - time.monotonic()), watch=True
        )
        return waited

    def _handed(self, op_id: str, deadline: float | None) -> Body[EffectResult]:
        """Hand a ready `op_id` to a worker and answer as `effect` does without inline."""
        if deadline is None:
            yield Call(self._try_publish, op_id)
            result: EffectResult = yield Call(self.result, op_id)
            return result
        waited: EffectResult = yield from self._waiting(
            op_id, max(0.0, deadline - time.monotonic()), publish=True
        )
        return waited

    def _record(self, intent: Intent, publish: bool, notify: bool = True) -> Asked:
        """Ask for the act; with `publish`, also enqueue its dispatch when it is ready
        (else the caller publishes it once it listens for the answer, or sends it itself);
        with `notify`, its settle NOTIFYs this process's listener."""
        with tracing.prepare(intent.tenant, intent.action) as span:  # the publish: its child
            asked = self.ledger.ask_intent(
                intent, notify=notify, actor="agent", traceparent=span.traceparent()
            )
            op = asked.operation
            span.prepared(op)
            if publish and _publishable(asked):
                self._try_publish(op.id)
        return asked

    def _as_asked(self, result: EffectResult, asked: Asked, intent: Intent) -> EffectResult:
        """The result as the answer to this ask: whether the intent was recorded before (by
        another run, for an act of the tenant's scope), and what this ask asked differently
        (payload fields named)."""
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
                differs.extend(
                    f"payload.{f}" for f in payload_differences(recorded, intent.payload)
                )
        first_run: str | None = asked.operation.workflow_id
        if first_run == check_key("workflow_id", intent.workflow_id):  # as it was recorded
            first_run = None
        return result.model_copy(
            update={
                "asked_before": True,
                "differs": tuple(differs),
                "first_asked_in": first_run,
            }
        )

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
        """How `op_id` stands now, as a result an agent can reason on (one statement; one
        more for an operation waiting on beat's relay: whether a beat runs)."""
        return self._noted(self._read(op_id))

    def _read(self, op_id: str) -> EffectResult:
        return self._result_of(self.ledger.answer(op_id))

    def _noted(self, result: EffectResult) -> EffectResult:
        """`result`, saying that it waits for beat when none runs (`waits_for_beat`)."""
        return waits_for_beat(result, self.ledger.beat_seen, self._beat_missing_after)

    def _result_of(self, answer: Answer) -> EffectResult:
        """`result_of` with the action's contract where this ledger's adapters know it (an
        unknown operation's next check is then said as what its provider allows)."""
        contract_for = getattr(getattr(self.ledger, "actions", None), "contract_for", None)
        contract = None
        if callable(contract_for):
            with contextlib.suppress(UnknownAction):
                contract = contract_for(answer.operation.action)
        return result_of(answer, contract)

    def wait(self, op_id: str, timeout: float) -> EffectResult:
        """Wait up to `timeout` seconds for `op_id` to settle (see `settled`); how it stands.

        Woken through this process's one listening connection (`listener_for`: the
        ledger's NOTIFY, within milliseconds of the settling commit), which reads the
        answer for it; reads again every `poll` seconds in case a notification was missed
        (every `FALLBACK_POLL` while that connection is down)."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        return run(self._waiting(op_id, timeout, watch=True))

    async def await_result(self, op_id: str, timeout: float) -> EffectResult:
        """`wait` for asyncio: the same listening connection wakes the task (with its
        answer read); its own reads run in a worker thread."""
        if timeout < 0:
            raise InvalidInput("timeout must not be negative", field="timeout")
        return await arun(self._waiting(op_id, timeout, watch=True))

    def _waiter(self, op_id: str, publish: bool = False) -> Waiter:
        """A waiter on `op_id`, answered by the listener (one statement per batch); with
        `publish`, the dispatch is published as soon as the waiter is registered."""
        return listener_for(self._dsn).watch(
            {op_id},
            subject=op_id,
            read=self.ledger.answers,
            then=(lambda: self._try_publish(op_id)) if publish else None,
        )

    def _waiting(
        self,
        op_id: str,
        timeout: float,
        *,
        watch: bool = False,
        publish: bool = False,
        known: EffectResult | None = None,
    ) -> Body[EffectResult]:
        """The body of every wait: its waiter registered first, then its dispatch published
        (`publish`); `watch` has it NOTIFY; how it stands is `known` when the caller knows
        it (just recorded, and the listener was listening before the dispatch went out),
        else read; then read again on each wake (the listener's answer) or poll."""
        deadline = time.monotonic() + timeout
        waiter: Waiter = yield Call(self._waiter, op_id, publish)
        with waiter:
            if watch:  # after the waiter listens: no settle falls between
                yield Call(self.ledger.watch, op_id)
            result: EffectResult
            if known is not None and waiter.heard:
                result = known
            else:
                result = yield Call(self._read, op_id)
            published = publish
            while not at_rest(result):
                waiter.watch(watched(result))
                if not published and _released(result):  # off the event loop, as a call
                    yield Call(self._try_publish, result.op_id)
                    published = True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                yield Sleep(waiter, min(remaining, self._interval()))
                # the answer the listener read for it, else read now (a poll, or a wake
                # of everyone after the listener reconnected)
                answer = waiter.answer()
                if answer is not None:
                    result = self._result_of(answer)
                else:
                    result = yield Call(self._read, op_id)
            noted: EffectResult = yield Call(self._noted, result)
            return noted

    def _interval(self) -> float:
        """How long a waiter sleeps at most between two reads: its poll, or the fallback
        poll while this process is not listening."""
        if listener_for(self._dsn).listening:
            return self.poll
        return min(self.poll, FALLBACK_POLL)


def _released(result: EffectResult) -> bool:
    """Whether a waiter publishes `result`'s operation at once: a dependent whose
    dependencies are all confirmed now, or an act released by its approval (the relay
    would, within a sweep interval)."""
    return (
        isinstance(result, EffectPending)
        and result.operation.status is Status.PREPARED
        and result.awaiting == "worker"
    )


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
