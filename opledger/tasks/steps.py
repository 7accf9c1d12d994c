"""What a worker does with one operation, without Celery: dispatch it, or reconcile it.

The Celery tasks are thin wrappers around these functions, and tests call them directly.
Every write goes through the ledger under a fence; every retry is the decision's call.
This is the algorithm alone: traces, metrics and crash points observe its boundaries
through `hooks` (`tasks.hooks`; `HOOKS` by default).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from opledger.adapters.base import Adapter, extra, sending
from opledger.adapters.registry import Registry
from opledger.ledger import (
    Ambiguous,
    AuthorizationRevoked,
    Claim,
    DatabaseUnavailable,
    EvidenceSource,
    History,
    Ledger,
    Operation,
    Outcome,
    ProviderBusy,
    Quarantined,
    SendWindowPassed,
    StaleFence,
    Status,
    UnknownAction,
    UnknownAuthorization,
)
from opledger.ledger.consequences import consequences
from opledger.ledger.contract import Limits
from opledger.ledger.decide import (
    AskProvider,
    Confirm,
    Decision,
    Dispatch,
    HoldUnknown,
    NeedsReview,
    Reject,
    ReviewPolicy,
    Wait,
    decide,
)
from opledger.ledger.evidence import NOT_SENT, admit

from .hooks import HOOKS, Hooks

log = logging.getLogger("opledger.worker")

#: the review policy when the caller names none (the settings' defaults)
DEFAULT_POLICY = ReviewPolicy()

#: how long a dispatch waits in its task for its provider's room by default
#: (OPLEDGER_PROVIDER_WAIT_SECONDS)
DEFAULT_WAIT = timedelta(seconds=2)

#: a held operation (no adapter of this worker serves its action) is tried again after a
#: quarter of the time it has been open, never sooner than HOLD_MIN nor later than HOLD_MAX
HOLD_MIN = timedelta(seconds=30)
HOLD_MAX = timedelta(minutes=15)

#: held operations this process has logged a warning about (bounded: cleared when full)
_held_announced: set[str] = set()
_HELD_ANNOUNCED_MAX = 10_000


def utcnow() -> datetime:
    return datetime.now(UTC)


class Step(StrEnum):
    """What a worker's step did with an operation."""

    NOOP = "noop"  #: nothing to do (redelivered, already claimed, finished)
    DISPATCHED = "dispatched"  #: sent, and the outcome recorded
    CONFIRMED = "confirmed"  #: settled as confirmed on evidence
    REJECTED = "rejected"  #: settled as rejected on evidence
    WAITING = "waiting"  #: a check is scheduled (in flight, pending, search lag)
    REVIEW = "review"  #: a person has it (a review is open)
    FENCED = "fenced"  #: another claim moved it first; this worker's writes were refused
    CANCELLED = "cancelled"  #: its grant was revoked before anything was sent
    #: no adapter of this worker serves its action: nothing sent, no review; tried again
    #: later (by whichever worker takes the check), so a worker that serves it resumes it
    HELD = "held"
    #: its provider had no room (its declared limits, a "not now", an open breaker):
    #: nothing claimed, nothing sent; tried again when the provider should have room
    BUSY = "busy"
    #: the ledger may have forgotten an earlier ask or attempt of it (a switch): nothing
    #: claimed or sent; it is unknown, and its provider's evidence decides (else a person)
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class StepResult:
    """What a step did, the operation as it ended, and the decision behind it."""

    action: Step
    operation: Operation | None = None
    decision: Decision | None = None


#: called with an operation id when a fenced-out worker's outcome was kept and the
#: operation is unknown: reconcile it now rather than at the next scheduled check
ReconcileNow = Callable[[str], None]


def _send(
    ledger: Ledger,
    adapter: Adapter,
    claim: Claim,
    reconcile_now: ReconcileNow | None = None,
    hooks: Hooks = HOOKS,
    limits: Limits | None = None,
) -> StepResult:
    """Cross the boundary under `claim` and record what came back.

    Nothing is sent once the claim's send-by window has passed: the window is checked
    here, and again at the wire (the shared HTTP client after connection set-up, SMTP
    after the envelope). A refused check is recorded as not sent (`NOT_SENT`), whatever the
    adapter made of it: the attempt provably carried no request.
    """
    provider = adapter.contract.provider
    with hooks.call(claim, provider) as call:
        try:
            claim.window.check()
            call.sending()
            with sending(claim.window):
                outcome = adapter.dispatch(claim)
            call.answered()
        except SendWindowPassed:
            outcome = _not_sent(claim)
        except Exception as exc:  # an adapter bug must not leave the row dispatching
            log.exception("adapter %s raised on %s", type(adapter).__name__, claim.op_id)
            call.error(exc)
            outcome = Ambiguous(code="adapter_error", reason=f"{type(exc).__name__}: {exc}"[:500])
        if claim.window.refused:  # the check raised inside the adapter: no byte left
            outcome = _not_sent(claim)
        call.outcome(outcome)
    outcome = admit(adapter.contract, claim, outcome)
    with hooks.record(claim.op_id, claim.fence, "provider", provider) as recording:
        recording.outcome(outcome)
        try:
            op = _save(ledger, claim, outcome, limits or adapter.contract.limits)
        except StaleFence as exc:
            recording.fenced()
            hooks.fenced_out("outcome")
            log.warning(
                "fenced out of %s; outcome kept as evidence",
                claim.op_id,
                extra={"op_id": claim.op_id, "fence": claim.fence, "attempt": claim.attempt_n},
            )
            if (
                reconcile_now is not None
                and exc.fields.get("evidence_kept")
                and (exc.fields.get("status") == Status.UNKNOWN.value)
            ):
                reconcile_now(claim.op_id)
            return StepResult(Step.FENCED)
        recording.status(op.status)
    return StepResult(Step.DISPATCHED, op)


def _not_sent(claim: Claim) -> Ambiguous:
    log.warning("%s: send-by window passed (send by %s); nothing sent", claim.op_id, claim.send_by)
    return Ambiguous(
        code=NOT_SENT,
        reason="not sent: the send-by window had passed",
        detail={
            "why": "window_passed",
            "send_by": claim.send_by.isoformat() if claim.send_by else None,
            "late_s": round(-claim.window.remaining(), 3),
        },
    )


def _save(
    ledger: Ledger, claim: Claim, outcome: Outcome, limits: Limits, attempts: int = 6
) -> Operation:
    """Record the outcome, riding out a short database outage: the provider already
    acted, so what it said is worth a few seconds of retrying. If the database stays
    away, the lease expires and the sweeper sends the operation to reconciliation."""
    for n in range(attempts):
        try:
            return ledger.record_outcome(claim, outcome, limits=limits)
        except DatabaseUnavailable:
            if n == attempts - 1:
                raise
            log.warning("saving the outcome of %s failed; retrying", claim.op_id)
            time.sleep(min(0.5 * 2**n, 5.0))
    raise AssertionError("unreachable")  # pragma: no cover


def dispatch(
    ledger: Ledger,
    registry: Registry,
    op_id: str,
    *,
    owner: str,
    lease: timedelta,
    reconcile_now: ReconcileNow | None = None,
    hooks: Hooks = HOOKS,
    wait: timedelta = DEFAULT_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> StepResult:
    """First dispatch of a prepared operation. A no-op for anything else (redelivery).
    `reconcile_now(op_id)` is called when this worker was fenced out but its outcome was kept
    on an unknown operation (to reconcile it at once).

    When its provider has no room (`ProviderBusy`: its declared limits, a "not now", an
    open breaker), nothing is claimed: the step waits here for up to `wait` in all, trying
    again as the ledger says room should come; past that it leaves the operation for later
    (`Ledger.defer`: the relay publishes it again then) and returns `Step.BUSY`."""
    waited = 0.0
    while True:
        with hooks.claim(op_id) as span:
            try:
                claim = ledger.claim(op_id, owner=owner, terms=registry.claim_terms(lease))
            except AuthorizationRevoked:
                span.status(Status.CANCELLED)
                return StepResult(Step.CANCELLED)
            except Quarantined:
                if reconcile_now is not None:
                    reconcile_now(op_id)
                return StepResult(Step.QUARANTINED, ledger.get(op_id))
            except ProviderBusy as busy:
                pause = _pause(busy)
                if waited + pause > wait.total_seconds():
                    return _defer(ledger, op_id, busy)
                waited += pause
                sleep(pause)
                continue
            if claim is None:
                log.info(
                    "dispatch of %s: not claimable (already claimed, finished or unknown)", op_id
                )
                return StepResult(Step.NOOP)
            span.claim(claim)
        break
    try:
        adapter = registry.adapter_for(claim.operation.action)
    except UnknownAction:
        return _hold_claimed(ledger, claim)
    limits = registry.limits_for(adapter.contract.provider)
    return _send(ledger, adapter, claim, reconcile_now, hooks, limits)


def _pause(busy: ProviderBusy) -> float:
    """How long to sleep before asking again, in seconds: what the ledger said, spread a
    little (`_spread`) so the processes waiting for one provider do not all ask at once."""
    return max(_spread(busy.retry_in).total_seconds(), 0.001)


def _defer(ledger: Ledger, op_id: str, busy: ProviderBusy) -> StepResult:
    """Leave a prepared operation whose provider has no room for later, and say why."""
    until = utcnow() + _spread(busy.retry_in)
    ledger.defer(op_id, until=until)
    log.info(
        "%s waits for %s until %s: %s",
        op_id,
        busy.provider,
        until.isoformat(timespec="seconds"),
        busy.why,
        extra={"op_id": op_id, "provider": busy.provider},
    )
    return StepResult(Step.BUSY)


def _spread(retry_in: timedelta) -> timedelta:
    """`retry_in` and up to a quarter more: operations that waited for one pause do not all
    come back in the same instant."""
    return retry_in * (1 + random.uniform(0, 0.25))


def hold_until(op: Operation, now: datetime) -> datetime:
    """When a held operation is tried again: after a quarter of the time it has been open,
    within `HOLD_MIN` and `HOLD_MAX` (a bounded backoff read from the clock alone)."""
    return now + min(HOLD_MAX, max(HOLD_MIN, (now - op.created_at) / 4))


def _hold_claimed(ledger: Ledger, claim: Claim) -> StepResult:
    """No adapter of this worker serves the claimed operation's action: a worker of an older
    or newer configuration may (a rolling deploy), or none does yet (a mistyped action
    prepared through a ledger that does not know the adapters). Nothing is sent and nobody
    is asked: the attempt is recorded as not sent (`NOT_SENT`, which no retry rule counts
    as having reached the provider), and the operation is held for a later check, which
    any worker may take: one that serves the action sends it under the same key."""
    op = claim.operation
    outcome = Ambiguous(
        code=NOT_SENT,
        reason=f"not sent: no adapter of this worker serves {op.action}; held",
        detail={"why": "no_adapter", "action": op.action},
    )
    now = utcnow()
    try:
        held = ledger.record_outcome(claim, outcome, recheck=hold_until(op, now) - now)
    except StaleFence:
        return StepResult(Step.FENCED)
    _announce_held(held)
    return StepResult(Step.HELD, held)


def _hold(ledger: Ledger, op: Operation, now: datetime) -> StepResult:
    """An unknown operation whose action no adapter of this worker serves: neither sent,
    looked up nor reviewed here; checked again later (`hold_until`)."""
    try:
        held = ledger.schedule_check(op.id, fence=op.fence, at=hold_until(op, now))
    except StaleFence:
        return StepResult(Step.FENCED)
    _announce_held(held)
    return StepResult(Step.HELD, held)


def _review_unserved(
    ledger: Ledger, op: Operation, after: timedelta, on_review: Callable[[str], None] | None
) -> StepResult:
    """Held longer than the review policy's `after` (OPLEDGER_REVIEW_AFTER_SECONDS): no
    deploy takes that long, so a person is asked (configure the adapter and retry, or
    cancel: a mistyped action is never served)."""
    reason = (
        f"no adapter has served {op.action} for {after}, so nothing was sent or looked up: "
        "configure one (OPLEDGER_ADAPTERS) and resolve as retry, or cancel"
    )
    try:
        review = ledger.open_review(
            op.id, fence=op.fence, reason=reason, snapshot={"reason": reason}
        )
    except StaleFence:
        return StepResult(Step.FENCED)
    if review is not None:
        log.error("%s: %s; a review is open", op.id, reason)
        if on_review is not None:
            on_review(op.id)
    return StepResult(Step.REVIEW, ledger.get(op.id))


def _announce_held(op: Operation) -> None:
    """A warning naming the operation and its action, once per operation in this process."""
    fields = {"op_id": op.id, "tenant": op.tenant, "action": op.action, "fence": op.fence}
    if op.id in _held_announced:
        log.debug("%s still held: no adapter serves %s", op.id, op.action, extra=fields)
        return
    if len(_held_announced) >= _HELD_ANNOUNCED_MAX:
        _held_announced.clear()
    _held_announced.add(op.id)
    log.warning(
        "%s held, not sent: no adapter of this worker serves %s; checked again until a worker "
        "whose adapters (OPLEDGER_ADAPTERS) serve it takes it (held longer than "
        "OPLEDGER_REVIEW_AFTER_SECONDS, a person is asked)",
        op.id,
        op.action,
        extra=fields,
    )


def snapshot(history: History, adapter: Adapter, reason: str, now: datetime) -> dict[str, Any]:
    """What the review opens with: the attempts, the evidence, the contract, and what each
    resolution could cause."""
    effects = consequences(
        adapter.contract, history.operation, history.attempts, now, history.evidence
    )
    hint = extra(adapter, "search_hint")
    return {
        "reason": reason,
        "search_hint": hint(history.operation) if callable(hint) else None,
        "contract": adapter.contract.model_dump(mode="json"),
        "attempts": [a.model_dump(mode="json") for a in history.attempts],
        "evidence": [e.model_dump(mode="json") for e in history.evidence],
        "consequences": effects.model_dump(mode="json"),
    }


def reconcile(
    ledger: Ledger,
    registry: Registry,
    op_id: str,
    *,
    owner: str,
    lease: timedelta,
    now: Callable[[], datetime] = utcnow,
    max_lookups: int = 2,
    policy: ReviewPolicy = DEFAULT_POLICY,
    on_review: Callable[[str], None] | None = None,
    reconcile_now: ReconcileNow | None = None,
    hooks: Hooks = HOOKS,
) -> StepResult:
    """Run the retry decision on an unknown operation and act on it. `on_review(op_id)` is
    called when this step opened a review (to notify someone); `reconcile_now` as in
    `dispatch`."""
    with hooks.decide(op_id) as span:
        decided = _decide(
            ledger,
            registry,
            op_id,
            now=now,
            max_lookups=max_lookups,
            policy=policy,
            hooks=hooks,
            on_review=on_review,
        )
        if isinstance(decided, StepResult):
            if decided.operation is not None:
                span.operation(decided.operation)
            return decided
        history, adapter, decision, lookups = decided
        span.operation(history.operation)
        span.decision(decision, lookups)
    op = history.operation
    if history.open_review is not None and not isinstance(decision, Confirm | Reject):
        # A person has it: only evidence that settles it acts before they do (a fenced-out
        # worker's late receipt, say); anything else waits for their resolution.
        return StepResult(Step.REVIEW, op, decision)
    try:
        return _act(
            ledger,
            registry,
            adapter,
            history,
            decision,
            owner=owner,
            lease=lease,
            now=now,
            on_review=on_review,
            reconcile_now=reconcile_now,
            hooks=hooks,
        )
    except StaleFence:
        hooks.fenced_out("reconcile")
        return StepResult(Step.FENCED, decision=decision)


def _decide(
    ledger: Ledger,
    registry: Registry,
    op_id: str,
    *,
    now: Callable[[], datetime],
    max_lookups: int,
    policy: ReviewPolicy,
    hooks: Hooks,
    on_review: Callable[[str], None] | None = None,
) -> StepResult | tuple[History, Adapter, Decision, int]:
    """The decision on `op_id`, after as many lookups as it asks for (at most
    `max_lookups`), with the history and adapter it was taken on and the lookups made; or
    what the step did when there was nothing to decide."""
    history = ledger.history(op_id)
    op = history.operation
    if op.status is not Status.UNKNOWN:
        return StepResult(Step.NOOP, op)
    try:
        adapter = registry.adapter_for(op.action)
    except UnknownAction:
        if history.open_review is not None:
            return StepResult(Step.REVIEW, op)  # a person has it already: say nothing
        first = min((a.started_at for a in history.attempts), default=op.created_at)
        if now() - first > policy.after:
            return _review_unserved(ledger, op, policy.after, on_review)
        return _hold(ledger, op, now())
    contract = adapter.contract
    try:
        grant = ledger.authorization(op.authorization_ref)
    except UnknownAuthorization:
        grant = None
    lookups = 0
    while True:
        decision = decide(contract, op, history.attempts, history.evidence, grant, now(), policy)
        if not isinstance(decision, AskProvider) or lookups >= max_lookups:
            break
        lookups += 1
        with hooks.lookup(op) as span:
            result = adapter.lookup(op, history.attempts)
            span.verdict(result.verdict)
        ledger.record_evidence(
            op.id,
            source=EvidenceSource.LOOKUP,
            verdict=result.verdict,
            binding=result.binding,
            detail=result.detail
            if result.result is None
            else {**result.detail, "result": result.result},
            fence=op.fence,
        )
        history = ledger.history(op_id)
        op = history.operation
        if op.status is not Status.UNKNOWN:
            return StepResult(Step.NOOP, op)
    kind = type(decision).__name__
    log.info(
        "reconcile of %s: %s",
        op.id,
        kind,
        extra={
            "op_id": op.id,
            "tenant": op.tenant,
            "action": op.action,
            "fence": op.fence,
            "attempt": len(history.attempts),
            "decision": kind,
        },
    )
    return history, adapter, decision, lookups


def _act(
    ledger: Ledger,
    registry: Registry,
    adapter: Adapter,
    history: History,
    decision: Decision,
    *,
    owner: str,
    lease: timedelta,
    now: Callable[[], datetime],
    on_review: Callable[[str], None] | None,
    reconcile_now: ReconcileNow | None = None,
    hooks: Hooks = HOOKS,
) -> StepResult:
    op = history.operation
    if isinstance(decision, Confirm | Reject):
        evidence = next(e for e in history.evidence if e.id == decision.evidence_id)
        to = Status.CONFIRMED if isinstance(decision, Confirm) else Status.REJECTED
        with hooks.record(op.id, op.fence, "evidence", op.provider) as recording:
            recording.set("opledger.outcome", to.value)
            try:
                settled = ledger.settle(
                    op.id,
                    fence=op.fence,
                    to=to,
                    evidence_id=evidence.id,
                    receipt_id=evidence.binding.receipt_id,
                    actor=owner,
                    reason=f"{evidence.source} evidence {evidence.id}",
                )
            except StaleFence:
                recording.fenced()
                raise
            recording.status(settled.status)
        return StepResult(Step(to.value), settled, decision)
    if isinstance(decision, Wait | HoldUnknown):
        at = decision.until if isinstance(decision, Wait) else decision.next_check
        return StepResult(
            Step.WAITING, ledger.schedule_check(op.id, fence=op.fence, at=at), decision
        )
    if isinstance(decision, AskProvider):  # lookups exhausted for this pass: look again soon
        at = now() + adapter.contract.lookup.interval
        return StepResult(
            Step.WAITING, ledger.schedule_check(op.id, fence=op.fence, at=at), decision
        )
    if isinstance(decision, NeedsReview):
        review = ledger.open_review(
            op.id,
            fence=op.fence,
            reason=decision.reason,
            snapshot=snapshot(history, adapter, decision.reason, now()),
        )
        if review is not None and on_review is not None:
            on_review(op.id)
        return StepResult(Step.REVIEW, ledger.get(op.id), decision)
    assert isinstance(decision, Dispatch)
    with hooks.claim(op.id, retry=True) as span:
        try:
            claim = ledger.claim_retry(
                op.id,
                owner=owner,
                expected_fence=op.fence,
                authorized_by=op.operator_retry_by,
                terms=registry.claim_terms(lease),
            )
        except AuthorizationRevoked:
            return StepResult(Step.NOOP, ledger.get(op.id), decision)
        except ProviderBusy as busy:
            # no room at the provider: the retry is checked again when there should be
            at = now() + _spread(busy.retry_in)
            return StepResult(
                Step.BUSY, ledger.schedule_check(op.id, fence=op.fence, at=at), decision
            )
        if claim is None:
            span.fenced()
            return StepResult(Step.FENCED, decision=decision)
        span.claim(claim)
    limits = registry.limits_for(adapter.contract.provider)
    result = _send(ledger, adapter, claim, reconcile_now, hooks, limits)
    return StepResult(result.action, result.operation, decision)
