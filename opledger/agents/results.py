"""What an agent reads back from an effect: how the operation stands, as a result it can
reason on (confirmed, rejected, cancelled, unknown, pending), read from the ledger's
answer (`result_of`), and whether waiting longer is pointless (`at_rest`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from opledger.ledger import Answer, Dependency, Operation, PendingApproval, Review, Status
from opledger.ledger.contract import Contract


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
    #: the run that asked for the act first, where that is another run than this ask's: an
    #: act of the tenant's scope (one act whatever run asks) that another run recorded
    first_asked_in: str | None = None
    #: how this call dispatched the act: "inline", claimed and sent in this process
    #: (`Effects(..., inline=...)`); "worker", handed to opledger's workers (published, or
    #: left to the relay); None, this call dispatched nothing (claimed elsewhere, held for
    #: a person's approval, waiting on its dependencies, its grant revoked, or only read)
    path: Literal["inline", "worker"] | None = None

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
        who = "This run" if self.first_asked_in is None else f"Run {self.first_asked_in}"
        text = (
            f"{who} already asked for {self._act()} (operation {self.op_id}); "
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
    """Nothing settled yet: it waits for a person's approval, its dependencies, a worker,
    or the provider's answer (when the wait ran out, or when nothing was waited for)."""

    kind: Literal["pending"] = "pending"
    #: what it waits for: a person's approval (nothing is sent before it: its action's
    #: approval policy asks), its dependencies, a worker to take it, or the provider (its
    #: answer to the attempt under way, or room for it: its limits, a "not now", an outage)
    awaiting: Literal["approval", "dependencies", "worker", "provider"]
    #: the same, in words
    waiting_for: str
    #: the dependencies not confirmed yet (each with the review holding it, if any)
    blocked_by: tuple[Dependency, ...] = ()
    #: why nothing was sent, when the ledger knows no attempt reached the provider (no
    #: worker that took it serves the action; the provider refused the connection)
    not_sent: str | None = None

    def _state(self) -> str:
        if self.not_sent is not None:
            return f"{self._act()} is not sent: {self.not_sent}; it waits for {self.waiting_for}."
        return f"{self._act()} is recorded and not settled yet: it waits for {self.waiting_for}."


EffectResult = EffectConfirmed | EffectRejected | EffectCancelled | EffectUnknown | EffectPending


def at_rest(result: EffectResult) -> bool:
    """Whether waiting longer is pointless: it is final, or a person holds it (its review,
    or the approval it waits for), or it waits on a dependency a person holds (or that can
    no longer be confirmed)."""
    if result.final:
        return True
    if isinstance(result, EffectUnknown):
        return result.review is not None
    if not isinstance(result, EffectPending):
        return True
    if result.awaiting == "approval":
        return True
    return any(
        d.review_id is not None or d.status in (Status.REJECTED, Status.CANCELLED)
        for d in result.blocked_by
    )


def watched(result: EffectResult) -> set[str]:
    """The operations a wait on `result` listens for: its own, and its dependencies."""
    ids = {result.op_id}
    if isinstance(result, EffectPending):
        ids.update(d.op_id for d in result.blocked_by)
    return ids


def result_of(answer: Answer, contract: Contract | None = None) -> EffectResult:
    """The ledger's answer for one operation (`Ledger.answer`) as a result; with its
    action's `contract` (what its adapter declares), an unknown operation's next check is
    said as what it can do (a provider with no lookup is never asked)."""
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
        if review is None and answer.unsent_why is not None:
            return _unsent(answer, answer.unsent_why)
        if review is not None:
            waiting = f"a person: review {review.id} ({review.reason})"
        elif op.next_check_at is not None:
            waiting = _next_check(op, contract)
        else:
            waiting = "evidence: a check is under way"
        return EffectUnknown(operation=op, review=review, waiting_for=waiting)
    blocked = answer.blocked_by
    on: Literal["approval", "dependencies", "worker", "provider"]
    if answer.awaiting_approval is not None:
        on, waiting = "approval", _approval(answer.awaiting_approval)
    elif blocked:
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


def _approval(pending: PendingApproval) -> str:
    """What an act held for approval waits for, in words: who must say yes, since when."""
    people = "a person" if pending.approvers_required == 1 else "two people"
    so_far = f" ({', '.join(pending.approved_by)} did)" if pending.approved_by else ""
    why = f" because {'; '.join(pending.reasons)}" if pending.reasons else ""
    return (
        f"approval by {people} who may approve it{so_far}, asked "
        f"{pending.requested_at.isoformat()}{why}; nothing is sent before it, and it is "
        f"cancelled if nobody approves by {pending.expires_at.isoformat()}"
    )


def _next_check(op: Operation, contract: Contract | None) -> str:
    """What an unknown operation's next check can do: look for evidence, unless its
    provider has no lookup (SMTP without a Sent folder). Then nothing can show whether it
    happened: once it can no longer be in flight, a provider that deduplicates is sent it
    again under the same key, and one that does not is left to a person (rule 7)."""
    at = op.next_check_at.isoformat() if op.next_check_at is not None else "once due"
    if contract is None or contract.lookup.kind != "none":
        return f"evidence: the next check at {at}"
    if contract.idempotency.kind == "none":
        return (
            f"a person: {op.provider} can neither be asked whether it happened nor be sent it "
            "again safely (no lookup, no deduplication), so a review opens once it can no "
            f"longer be in flight (checked next at {at})"
        )
    return (
        f"a retry under the same key once it can no longer be in flight ({op.provider} has no "
        f"lookup; it deduplicates by the key), or a person if the rules allow none (checked "
        f"next at {at})"
    )


def _unsent(answer: Answer, why: str) -> EffectPending:
    """An unknown operation of which no attempt may have reached the provider: nothing
    happened yet, and the agent is told so (not "it may have"), with why and what it waits
    for."""
    op = answer.operation
    when = f" (tried again at {op.next_check_at.isoformat()})" if op.next_check_at else ""
    on: Literal["worker", "provider"] = "worker"
    if why == "no_adapter":
        not_sent = f"no worker that took it serves {op.action} (none has an adapter for it)"
        waiting = f"a worker whose adapters (OPLEDGER_ADAPTERS) serve {op.action}"
    elif why == "no_connection":
        on = "provider"
        not_sent = f"{op.provider} did not take the connection"
        waiting = f"{op.provider} to take it"
    else:
        not_sent = f"the attempt sent nothing ({why})"
        waiting = "another attempt"
    return EffectPending(operation=op, awaiting=on, waiting_for=waiting + when, not_sent=not_sent)


def _describe(dep: Dependency) -> str:
    text = f"{dep.op_id} ({dep.action} {dep.target}) is {dep.status}"
    if dep.review_id is not None:
        text += f", held by review {dep.review_id}: {dep.review_reason}"
    return text
