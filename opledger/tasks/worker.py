"""What a worker does with one operation, without Celery: `Worker`.

A `Worker` is a plain object over a narrow ledger (`ledger.facades.WorkerLedger`: the
Postgres `Ledger`, or the in-memory twin the unit tests use), the adapters (`Registry`),
its settings (`WorkerConfig`), a clock, and its hooks. Its methods are the steps:
`dispatch(op_id)`, `reconcile(op_id)`, `send(adapter, claim)` and `notify_review(op_id)`.
The Celery tasks (`tasks.app`) only unpack an operation id and call one of them.

Every write goes through the ledger under a fence; every retry is the decision's call.
This is the algorithm alone: traces and metrics (and, in the development harness, crash
points) observe its boundaries through `hooks` (`tasks.hooks`; `HOOKS` by default).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from opledger.adapters.base import Adapter, sending
from opledger.adapters.registry import Registry
from opledger.ledger import (
    Ambiguous,
    AuthorizationRevoked,
    Claim,
    DatabaseUnavailable,
    EvidenceSource,
    History,
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
from opledger.ledger.claims import settled_answer
from opledger.ledger.decide import (
    AskProvider,
    Confirm,
    Decision,
    Dispatch,
    HoldUnknown,
    NeedsReview,
    Reject,
    Wait,
    decide,
)
from opledger.ledger.evidence import NOT_SENT, admit
from opledger.ledger.facades import WorkerLedger

from .config import (
    DEFAULT_POLICY,
    DEFAULT_WAIT,
    FollowUp,
    FollowUps,
    WorkerConfig,
    claim_as_configured,
)
from .held import announce_held, hold_until
from .hooks import HOOKS, Hooks
from .notices import notify_review
from .outcomes import duplicate_settled, flag_duplicate, not_sent
from .results import Step, StepResult
from .snapshots import snapshot

if TYPE_CHECKING:
    pass

log = logging.getLogger("opledger.worker")

#: the most `_spread` adds to a wait
SPREAD_MAX = timedelta(seconds=1)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Worker:
    """One worker's steps over `ledger` with the adapters of `registry`.

    `owner` names it in leases and the audit; `clock` is its time (the decision's `now`),
    `sleep` how it waits for a provider's room; `follow_ups` what it asks of the queues."""

    def __init__(
        self,
        ledger: WorkerLedger,
        registry: Registry,
        *,
        owner: str,
        config: WorkerConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        sleep: Callable[[float], None] = time.sleep,
        hooks: Hooks = HOOKS,
        follow_ups: FollowUps | None = None,
    ) -> None:
        self.ledger = ledger
        self.registry = registry
        self.owner = owner
        self.config = config or WorkerConfig()
        self.clock = clock
        self.sleep = sleep
        self.hooks = hooks
        self.follow_ups = follow_ups or FollowUps()

    # -- dispatch ----------------------------------------------------------------------------

    def dispatch(self, op_id: str) -> StepResult:
        """First dispatch of a prepared operation. A no-op for anything else (redelivery).

        When its provider has no room (`ProviderBusy`: its declared limits, a "not now", an
        open breaker), nothing is claimed, and the refusal says when room comes for sure
        (the rate's next call, a pause's end, the first slot's in-flight deadline). Room
        within `config.wait` (in all) is waited for here; later room outside any process:
        the operation is deferred until then (the relay publishes it), `Step.BUSY`, and a
        call that answers sooner wakes the provider's oldest waiting operation (`_wake`)."""
        claimed = self._claim(op_id)
        if isinstance(claimed, StepResult):
            return claimed
        try:
            adapter = self.registry.adapter_for(claimed.operation.action)
        except UnknownAction:
            return self._hold_claimed(claimed)
        return self.send(adapter, claimed)

    def _claim(self, op_id: str) -> Claim | StepResult:
        """The dispatch's claim, waiting for the provider's room; or what the step did.
        Deferred, it asks once more: a slot given back before the deferral woke no one."""
        waited, deferred = 0.0, False
        terms = self.registry.claim_terms(self.config.lease)
        while True:
            with self.hooks.claim(op_id) as span:
                try:
                    claim = self.ledger.claim(op_id, owner=self.owner, terms=terms)
                except AuthorizationRevoked:
                    span.status(Status.CANCELLED)
                    return StepResult(Step.CANCELLED)
                except Quarantined:
                    self.follow_ups.reconcile(op_id)
                    return StepResult(Step.QUARANTINED, self.ledger.get(op_id))
                except ProviderBusy as busy:
                    if deferred:
                        return StepResult(Step.BUSY)
                    pause = max(_spread(busy.retry_in).total_seconds(), 0.001)
                    if waited + pause > self.config.wait.total_seconds():
                        deferred = self._defer(op_id, busy)
                        if not deferred:  # no longer prepared (claimed, cancelled)
                            return StepResult(Step.NOOP)
                        continue
                    waited += pause
                    self.sleep(pause)
                    continue
                if claim is None:
                    log.info(
                        "dispatch of %s: not claimable (already claimed, finished or unknown)",
                        op_id,
                    )
                    return StepResult(Step.NOOP)
                span.claim(claim)
                return claim

    def _defer(self, op_id: str, busy: ProviderBusy) -> bool:
        """Leave a prepared operation whose provider has no room until room comes for sure
        (`busy.retry_in`), and say why; False when it is no longer prepared."""
        until = self.clock() + _spread(busy.retry_in)
        if not self.ledger.defer(op_id, until=until):
            return False
        log.info(
            "%s waits for %s until %s: %s",
            op_id,
            busy.provider,
            until.isoformat(timespec="seconds"),
            busy.why,
            extra={"op_id": op_id, "provider": busy.provider},
        )
        return True

    # -- the provider call and its outcome ---------------------------------------------------

    def send(self, adapter: Adapter, claim: Claim, history: History | None = None) -> StepResult:
        """Cross the boundary under `claim` and record what came back.

        Nothing is sent once the claim's send-by window has passed: the window is checked
        here, and again at the wire (the shared HTTP client after connection set-up, SMTP
        after the envelope). A refused check is recorded as not sent (`NOT_SENT`), whatever
        the adapter made of it: the attempt provably carried no request. A fresh success
        that may repeat an earlier attempt is saved with a review (`flag_duplicate`; the
        decision's `history`, if the caller has it, spares reading it again)."""
        outcome = self._call(adapter, claim)
        outcome, review = flag_duplicate(
            self.ledger, adapter, claim, outcome, history, self.clock()
        )
        provider = adapter.contract.provider
        with self.hooks.record(claim.op_id, claim.fence, "provider", provider) as recording:
            recording.outcome(outcome)
            try:
                op = self._save(claim, outcome, provider, review=review)
            except StaleFence as exc:
                recording.fenced()
                self.hooks.fenced_out("outcome")
                log.warning(
                    "fenced out of %s; outcome kept as evidence",
                    claim.op_id,
                    extra={"op_id": claim.op_id, "fence": claim.fence, "attempt": claim.attempt_n},
                )
                if exc.fields.get("evidence_kept") and (
                    exc.fields.get("status") == Status.UNKNOWN.value
                ):
                    self.follow_ups.reconcile(claim.op_id)
                return StepResult(Step.FENCED)
            recording.status(op.status)
        if review is not None and op.status is Status.CONFIRMED:
            self.follow_ups.review_opened(op.id)
        return StepResult(Step.DISPATCHED, op, answer=settled_answer(op, outcome))

    def _call(self, adapter: Adapter, claim: Claim) -> Outcome:
        """The adapter's dispatch under the claim's window, and what it may count as
        (`admit`, with the adapter's contract: the worker's one admission of an outcome)."""
        with self.hooks.call(claim, adapter.contract.provider) as call:
            try:
                claim.window.check()
                call.sending()
                with sending(claim.window):
                    outcome = adapter.dispatch(claim)
                call.answered()
            except SendWindowPassed:
                outcome = not_sent(claim)
            except Exception as exc:  # an adapter bug must not leave the row dispatching
                log.exception("adapter %s raised on %s", type(adapter).__name__, claim.op_id)
                call.error(exc)
                reason = f"{type(exc).__name__}: {exc}"[:500]
                outcome = Ambiguous(code="adapter_error", reason=reason)
            if claim.window.refused:  # the check raised inside the adapter: no byte left
                outcome = not_sent(claim)
            call.outcome(outcome)
        return admit(adapter.contract, claim, outcome)

    def _save(
        self,
        claim: Claim,
        outcome: Outcome,
        provider: str,
        recheck: timedelta = timedelta(0),
        tries: int = 6,
        review: dict[str, Any] | None = None,
    ) -> Operation:
        """Record the outcome under the limits enforced for `provider` (the registry's: the
        worker's one source of them), riding out a short database outage: the provider
        already acted, so what it said is worth a few seconds of retrying. If the database
        stays away, the lease expires and the sweeper sends the operation to
        reconciliation."""
        limits = self.registry.limits_for(provider)
        for n in range(tries):
            try:
                return self.ledger.record_outcome(
                    claim, outcome, recheck=recheck, limits=limits, wake=self._wake, review=review
                )
            except DatabaseUnavailable:
                if n == tries - 1:
                    raise
                log.warning("saving the outcome of %s failed; retrying", claim.op_id)
                self.sleep(min(0.5 * 2**n, 5.0))
        raise AssertionError("unreachable")  # pragma: no cover

    def _wake(self, op_id: str) -> None:
        """An outcome gave its provider's slot back and woke `op_id`, the provider's oldest
        operation deferred for room (now due): publish it. Best effort: a lost publish is
        the relay's (the operation is due), a slot taken first wakes another at its end."""
        try:
            self.follow_ups.dispatch(op_id)
        except Exception as exc:  # kombu/redis/amqp errors differ by transport
            log.warning(
                "%s was woken for its provider's free slot but not published (%s: %s); "
                "the relay will publish it",
                op_id,
                type(exc).__name__,
                exc,
                extra={"op_id": op_id},
            )

    # -- held: no adapter of this worker serves the action ---------------------------------

    def _hold_claimed(self, claim: Claim) -> StepResult:
        """No adapter of this worker serves the claimed operation's action: a worker of an
        older or newer configuration may (a rolling deploy), or none does yet (a mistyped
        action prepared through a ledger that does not know the adapters). Nothing is sent
        and nobody is asked: the attempt is recorded as not sent (`NOT_SENT`, which no
        retry rule counts as having reached the provider), and the operation is held for a
        later check, which any worker may take: one that serves the action sends it under
        the same key."""
        op = claim.operation
        outcome = Ambiguous(
            code=NOT_SENT,
            reason=f"not sent: no adapter of this worker serves {op.action}; held",
            detail={"why": "no_adapter", "action": op.action},
        )
        now = self.clock()
        try:
            held = self._save(
                claim, outcome, op.provider, recheck=hold_until(op, now) - now, tries=1
            )
        except StaleFence:
            return StepResult(Step.FENCED)
        announce_held(held)
        return StepResult(Step.HELD, held)

    def _hold(self, op: Operation) -> StepResult:
        """An unknown operation whose action no adapter of this worker serves: neither sent,
        looked up nor reviewed here; checked again later (`hold_until`)."""
        try:
            held = self.ledger.schedule_check(
                op.id, fence=op.fence, at=hold_until(op, self.clock())
            )
        except StaleFence:
            return StepResult(Step.FENCED)
        announce_held(held)
        return StepResult(Step.HELD, held)

    def _review_unserved(self, op: Operation) -> StepResult:
        """Held longer than the review policy's `after` (OPLEDGER_REVIEW_AFTER_SECONDS): no
        deploy takes that long, so a person is asked (configure the adapter and retry, or
        cancel: a mistyped action is never served)."""
        reason = (
            f"no adapter has served {op.action} for {self.config.policy.after}, so nothing was "
            "sent or looked up: configure one (OPLEDGER_ADAPTERS) and resolve as retry, or "
            "cancel"
        )
        try:
            review = self.ledger.open_review(
                op.id, fence=op.fence, reason=reason, snapshot={"reason": reason}
            )
        except StaleFence:
            return StepResult(Step.FENCED)
        if review is not None:
            log.error("%s: %s; a review is open", op.id, reason)
            self.follow_ups.review_opened(op.id)
        return StepResult(Step.REVIEW, self.ledger.get(op.id))

    # -- reconcile ---------------------------------------------------------------------------

    def reconcile(self, op_id: str) -> StepResult:
        """Run the retry decision on an unknown operation and act on it."""
        with self.hooks.decide(op_id) as span:
            decided = self._decide(op_id)
            if isinstance(decided, StepResult):
                if decided.operation is not None:
                    span.operation(decided.operation)
                return decided
            history, adapter, decision, lookups = decided
            span.operation(history.operation)
            span.decision(decision, lookups)
        if history.open_review is not None and not isinstance(decision, Confirm | Reject):
            # A person has it: only evidence that settles it acts before they do (a fenced-out
            # worker's late receipt, say); anything else waits for their resolution.
            return StepResult(Step.REVIEW, history.operation, decision)
        try:
            return self._act(adapter, history, decision)
        except StaleFence:
            self.hooks.fenced_out("reconcile")
            return StepResult(Step.FENCED, decision=decision)

    def _decide(self, op_id: str) -> StepResult | tuple[History, Adapter, Decision, int]:
        """The decision on `op_id`, after as many lookups as it asks for (at most
        `config.max_lookups`), with the history and adapter it was taken on and the lookups
        made; or what the step did when there was nothing to decide."""
        history = self.ledger.history(op_id)
        op = history.operation
        if op.status is not Status.UNKNOWN:
            return StepResult(Step.NOOP, op)
        try:
            adapter = self.registry.adapter_for(op.action)
        except UnknownAction:
            return self._unserved(history)
        try:
            grant = self.ledger.authorization(op.authorization_ref)
        except UnknownAuthorization:
            grant = None
        policy, lookups = self.config.policy, 0
        while True:
            decision = decide(
                adapter.contract,
                op,
                history.attempts,
                history.evidence,
                grant,
                self.clock(),
                policy,
            )
            if not isinstance(decision, AskProvider) or lookups >= self.config.max_lookups:
                break
            lookups += 1
            self._look_up(adapter, history)
            history = self.ledger.history(op_id)
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

    def _unserved(self, history: History) -> StepResult:
        """An unknown operation no adapter of this worker serves: held, or a person asked."""
        op = history.operation
        if history.open_review is not None:
            return StepResult(Step.REVIEW, op)  # a person has it already: say nothing
        first = min((a.started_at for a in history.attempts), default=op.created_at)
        if self.clock() - first > self.config.policy.after:
            return self._review_unserved(op)
        return self._hold(op)

    def _look_up(self, adapter: Adapter, history: History) -> None:
        """One lookup at the provider, kept as evidence under the operation's fence."""
        op = history.operation
        with self.hooks.lookup(op) as span:
            result = adapter.lookup(op, history.attempts)
            span.verdict(result.verdict)
        detail = (
            result.detail if result.result is None else {**result.detail, "result": result.result}
        )
        self.ledger.record_evidence(
            op.id,
            source=EvidenceSource.LOOKUP,
            verdict=result.verdict,
            binding=result.binding,
            detail=detail,
            fence=op.fence,
        )

    def _act(self, adapter: Adapter, history: History, decision: Decision) -> StepResult:
        """Do what the decision says: settle, wait, look again later, ask a person, retry."""
        op = history.operation
        if isinstance(decision, Confirm | Reject):
            return self._settle(history, decision, adapter)
        if isinstance(decision, Wait | HoldUnknown):
            at = decision.until if isinstance(decision, Wait) else decision.next_check
            return self._check_at(op, at, decision)
        if isinstance(decision, AskProvider):  # lookups exhausted for this pass: look again soon
            return self._check_at(op, self.clock() + adapter.contract.lookup.interval, decision)
        if isinstance(decision, NeedsReview):
            review = self.ledger.open_review(
                op.id,
                fence=op.fence,
                reason=decision.reason,
                snapshot=snapshot(history, adapter, decision.reason, self.clock()),
            )
            if review is not None:
                self.follow_ups.review_opened(op.id)
            return StepResult(Step.REVIEW, self.ledger.get(op.id), decision)
        assert isinstance(decision, Dispatch)
        return self._retry(adapter, history, decision)

    def _check_at(self, op: Operation, at: datetime, decision: Decision) -> StepResult:
        checked = self.ledger.schedule_check(op.id, fence=op.fence, at=at)
        return StepResult(Step.WAITING, checked, decision)

    def _settle(self, history: History, decision: Confirm | Reject, adapter: Adapter) -> StepResult:
        """Settle on the evidence the decision cites (a possible duplicate's review with it)."""
        op = history.operation
        evidence = next(e for e in history.evidence if e.id == decision.evidence_id)
        to = Status.CONFIRMED if isinstance(decision, Confirm) else Status.REJECTED
        review = duplicate_settled(adapter, history, evidence, self.clock())  # or None
        with self.hooks.record(op.id, op.fence, "evidence", op.provider) as recording:
            recording.set("opledger.outcome", to.value)
            try:
                settled = self.ledger.settle(
                    op.id,
                    fence=op.fence,
                    to=to,
                    evidence_id=evidence.id,
                    receipt_id=evidence.binding.receipt_id,
                    actor=self.owner,
                    reason=f"{evidence.source} evidence {evidence.id}",
                    review=review,
                )
            except StaleFence:
                recording.fenced()
                raise
            recording.status(settled.status)
        if review is not None and settled.status is Status.CONFIRMED:
            self.follow_ups.review_opened(op.id)
        return StepResult(Step(to.value), settled, decision)

    def _retry(self, adapter: Adapter, history: History, decision: Dispatch) -> StepResult:
        """Send again under a new claim taken at the fence the decision saw."""
        op = history.operation
        with self.hooks.claim(op.id, retry=True) as span:
            try:
                claim = self.ledger.claim_retry(
                    op.id,
                    owner=self.owner,
                    expected_fence=op.fence,
                    authorized_by=op.operator_retry_by,
                    terms=self.registry.claim_terms(self.config.lease),
                )
            except AuthorizationRevoked:
                return StepResult(Step.NOOP, self.ledger.get(op.id), decision)
            except ProviderBusy as busy:
                # no room at the provider: the retry is checked again when there should be
                at = self.clock() + _spread(busy.retry_in)
                return StepResult(
                    Step.BUSY, self.ledger.schedule_check(op.id, fence=op.fence, at=at), decision
                )
            if claim is None:
                span.fenced()
                return StepResult(Step.FENCED, decision=decision)
            span.claim(claim)
        result = self.send(adapter, claim, history)
        return StepResult(result.action, result.operation, decision)

    # -- a review's notification -------------------------------------------------------------

    def notify_review(self, op_id: str, *, traceparent: str | None = None) -> str:
        """Prepare the notification of `op_id`'s open review and have it dispatched
        (`notices.notify_review`); what was done: "noop", "skipped" or "prepared"."""
        return notify_review(
            self.ledger,
            op_id,
            webhook_url=self.config.review_webhook_url,
            dispatch=self.follow_ups.dispatch,
            traceparent=traceparent,
        )


def _spread(retry_in: timedelta) -> timedelta:
    """`retry_in` and up to a quarter more (at most `SPREAD_MAX`): operations that waited
    for one pause do not all come back in the same instant."""
    return retry_in + min(retry_in / 4, SPREAD_MAX) * random.uniform(0, 1)


__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_WAIT",
    "FollowUp",
    "FollowUps",
    "Step",
    "StepResult",
    "Worker",
    "WorkerConfig",
    "claim_as_configured",
    "snapshot",
    "utcnow",
]
