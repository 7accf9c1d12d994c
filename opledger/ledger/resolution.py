"""The rules of resolving a review, apart from the queue that applies them
(`reviews.Reviews.resolve`): which resolutions exist, which evidence a resolution would
contradict, what a retry needs acknowledged, and what changed since an operator's view.
Pure: no database."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from .consequences import consequences
from .contract import Contract
from .errors import (
    InvalidInput,
    ResolutionNotAllowed,
    RetryNeedsAcknowledgement,
    RetryNeedsNewKey,
)
from .evidence import binds, our_keys
from .ids import new_key_for
from .models import Attempt, Evidence, EvidenceSource, History, Operation, Verdict
from .risk import retention_risk


class Resolution(StrEnum):
    CONFIRMED = "confirmed"  #: the effect happened (operator's evidence)
    REJECTED = "rejected"  #: it did not and will not
    RETRY = "retry"  #: send again, under the same operation
    CANCEL = "cancel"  #: stop; whatever happened stays
    #: a settled operation's review (a possible duplicate) was dealt with: the operation
    #: stays as it is; the note says what the operator found and did
    ACKNOWLEDGED = "acknowledged"


#: the resolutions that move an unknown operation (the review of a settled one takes none)
MOVING = frozenset({Resolution.CONFIRMED, Resolution.REJECTED, Resolution.RETRY, Resolution.CANCEL})


def resolution_of(resolution: Resolution | str, *, new_key: bool) -> Resolution:
    try:
        chosen = Resolution(resolution)
    except ValueError as exc:
        raise InvalidInput(f"resolution must be one of {[r.value for r in Resolution]}") from exc
    if new_key and chosen is not Resolution.RETRY:
        raise InvalidInput("--new-key only goes with a retry")
    return chosen


def check_fits(op: Operation, chosen: Resolution) -> None:
    """Refuse a resolution that does not fit the review (`ResolutionNotAllowed`): the
    review of a settled operation (a possible duplicate: it was confirmed, and a person is
    asked to check for a second effect) is resolved as acknowledged and moves nothing; an
    unknown operation's review needs a resolution that settles it or retries it."""
    if op.status.final and chosen in MOVING:
        raise ResolutionNotAllowed(
            f"{op.id} is {op.status.value}: its review asks a person to check for a "
            f"duplicate, not to settle it; {chosen.value} would move a settled operation. "
            "Resolve it as acknowledged, saying in the note what you found and did",
            op_id=op.id,
            status=op.status.value,
            resolution=chosen.value,
        )
    if not op.status.final and chosen is Resolution.ACKNOWLEDGED:
        raise ResolutionNotAllowed(
            f"{op.id} is {op.status.value}: acknowledged resolves only the review of a "
            "settled operation; this one needs confirmed, rejected, retry or cancel",
            op_id=op.id,
            status=op.status.value,
            resolution=chosen.value,
        )


def contradicted(
    contract: Contract | None,
    op: Operation,
    attempts: tuple[Attempt, ...],
    evidence: tuple[Evidence, ...],
    chosen: Resolution,
) -> str:
    """Which bound evidence on record this resolution contradicts ('' for none)."""
    keys = our_keys(op, attempts)
    against = {
        Resolution.REJECTED: Verdict.CONFIRMED,
        Resolution.RETRY: Verdict.CONFIRMED,
        Resolution.CONFIRMED: Verdict.REJECTED,
    }.get(chosen)
    hits = [
        ev
        for ev in evidence
        if against is not None
        and ev.source is not EvidenceSource.OPERATOR
        and ev.verdict == against
        and binds(ev, op, keys, contract)
    ]
    return ", ".join(f"{ev.source} evidence {ev.id}: {ev.verdict}" for ev in hits)


def retry_terms(
    contract: Contract | None,
    op: Operation,
    attempts: tuple[Attempt, ...],
    evidence: tuple[Evidence, ...],
    new_key: bool,
    acknowledge: bool,
) -> tuple[str | None, bool]:
    """The new key, if any, and whether the retry's risk was acknowledged; raises when
    a retry that could repeat the effect was not acknowledged."""
    key = new_key_for(op.idempotency_key, len(attempts) + 1) if new_key else None
    if contract is None:
        if new_key:
            return key, True
        raise RetryNeedsNewKey(
            f"no adapter contract is known for {op.action}: a same-key retry cannot be "
            "judged safe; use a new key to acknowledge the risk",
            op_id=op.id,
        )
    effects = consequences(contract, op, attempts, datetime.now(UTC), evidence)
    if contract.idempotency.kind == "none":
        if not (acknowledge or new_key):
            raise RetryNeedsAcknowledgement(
                f"{effects.retry} Acknowledge the risk to retry (--accept-risk).",
                op_id=op.id,
            )
        return key, True
    if new_key:
        return key, True
    if effects.same_key_retry_allowed:
        return None, False
    now = datetime.now(UTC)
    if retention_risk(contract, op, attempts, evidence, now) is not None:
        # the provider may have forgotten the key: the same key is a new request
        raise RetryNeedsNewKey(effects.retry, op_id=op.id)
    # the key no longer protects the retry (released on an error, lost on a restart,
    # another scope), but it may still deduplicate: keep it, once the risk is accepted
    if not acknowledge:
        raise RetryNeedsAcknowledgement(
            f"{effects.retry} Acknowledge the risk to retry (--accept-risk).", op_id=op.id
        )
    return None, True


def changes_since(shown: dict[str, Any], history: History) -> tuple[str, ...]:
    """What changed between the view an operator was shown (`_shown`) and `history`, one
    plain sentence per fact: the status, new or finished attempts, new evidence."""
    op = history.operation
    changes: list[str] = []
    if shown.get("status") not in (None, op.status.value):
        changes.append(f"status {shown['status']} is now {op.status.value}")
    before_attempts = {a.get("n"): a for a in shown.get("attempts", [])}
    for attempt in history.attempts:
        old = before_attempts.get(attempt.n)
        if old is None:
            by = f", authorized by {attempt.authorized_by}" if attempt.authorized_by else ""
            changes.append(
                f"new attempt {attempt.n} started {_when(attempt.started_at)}{by}"
                + (f", outcome {attempt.outcome}" if attempt.outcome else ", outcome not known yet")
            )
        elif old.get("outcome") != attempt.outcome:
            changes.append(
                f"attempt {attempt.n} finished {_when(attempt.finished_at)}: "
                f"{attempt.outcome or 'no outcome'}"
            )
    seen_evidence = {e.get("id") for e in shown.get("evidence", [])}
    for ev in history.evidence:
        if ev.id not in seen_evidence:
            why = ev.detail.get("reason") or ev.detail.get("code") or ev.detail.get("note")
            changes.append(
                f"new evidence {ev.id} from {ev.source.value}: {ev.verdict.value}"
                + (f" ({why})" if why else "")
                + ("" if ev.applied else ", kept without moving the status")
            )
    if op.operator_retry_by:
        changes.append(f"a retry was authorized by {op.operator_retry_by}")
    if not changes:
        changes.append(
            f"the record moved from version {shown.get('record_version')} to {op.record_version}"
        )
    return tuple(changes)


def _when(value: Any) -> str:
    return str(value)[:19].replace("T", " ")
