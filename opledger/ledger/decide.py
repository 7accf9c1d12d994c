"""The retry decision: a pure function of the contract, the history and the time.

No I/O and no clock reads: everything it needs is passed in, so it can be tested over
generated histories. Each rule of the design is marked where it is applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import Field

from .contract import Contract
from .models import (
    Ambiguous,
    Attempt,
    Authorization,
    Binding,
    Claim,
    Confirmed,
    Evidence,
    EvidenceSource,
    Operation,
    Outcome,
    Record,
    Rejected,
    Status,
    Verdict,
)

# Codes an adapter (or `admit`) uses for outcomes the decision treats specially.
IDEMPOTENCY_MISMATCH = "idempotency_mismatch"  #: the key was used with another payload
KEY_POISONED = "key_poisoned"  #: the provider wants a new key after a failed attempt
SERVER_ERROR = "server_error"  #: a 5xx (or a failure the provider reported) after sending
IN_FLIGHT = "in_flight"  #: the provider refused this attempt: one with the key is executing
NOT_SENT = "not_sent"  #: provably nothing reached the provider (refused connection, window)
STATE_CONFLICT = "state_conflict"  #: a refusal our own earlier attempt may have caused
BINDING_MISMATCH = "binding_mismatch"  #: a receipt that names another key, target or body
UNBOUND_RESPONSE = "unbound_response"  #: a success that does not show it answers our request

DISPATCH, LOOKUP = EvidenceSource.DISPATCH, EvidenceSource.LOOKUP


class Dispatch(Record):
    """Send (again) now, with this key and the frozen payload whose digest is given."""

    idempotency_key: str
    payload_digest: str


class Wait(Record):
    """An earlier attempt may still be in flight: nothing may be sent before `until`."""

    until: datetime


class AskProvider(Record):
    """Look the request up at the provider now (its status API or search)."""


class Confirm(Record):
    """Evidence `evidence_id` binds this operation: it happened."""

    evidence_id: int


class Reject(Record):
    """Evidence `evidence_id` is the provider's definitive refusal of this request."""

    evidence_id: int


class HoldUnknown(Record):
    """Still unknown; look again at `next_check`."""

    next_check: datetime
    reason: str


class NeedsReview(Record):
    """Nothing automatic can resolve it safely: a person decides (a review opens)."""

    reason: str


Decision = Dispatch | Wait | AskProvider | Confirm | Reject | HoldUnknown | NeedsReview


class ReviewPolicy(Record):
    """When a person takes over even though the contract would let us keep trying."""

    #: attempts that left it unknown (the contract's own `max_attempts` applies if lower)
    after_attempts: int = Field(default=5, gt=0)
    #: time since the first attempt while it is still waiting or looking
    after: timedelta = timedelta(hours=24)


def our_keys(operation: Operation, attempts: Sequence[Attempt]) -> frozenset[str]:
    """Every idempotency key this operation was, or will be, sent under."""
    return frozenset({operation.idempotency_key, *(a.idempotency_key for a in attempts)})


def human(delta: timedelta) -> str:
    """A duration as a person reads it: "31 h", "2 min", "45 s"."""
    seconds = int(delta.total_seconds())
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} d"
    if seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def binding_clashes(binding: Binding, operation: Operation, key: str | None) -> list[str]:
    """What a receipt names that is not ours: another key, target or payload digest."""
    return [
        name
        for name, theirs, ours in (
            ("key", binding.idempotency_key, key),
            ("target", binding.target, operation.target),
            ("payload_digest", binding.payload_digest, operation.payload_digest),
        )
        if theirs is not None and ours is not None and theirs != ours
    ]


def _unbound(contract: Contract, binding: Binding, replayed: bool) -> str | None:
    """Why a success response does not show that it answers our request, or None."""
    if contract.response_binds in ("key", "key_and_digest") and binding.idempotency_key is None:
        return "the response does not name our key, although the provider gives it"
    if contract.response_binds == "key_and_digest" and binding.payload_digest is None:
        return (
            "the response does not name the request body it executed, although the provider "
            "gives it"
        )
    if replayed and not contract.idempotency.payload_checked and binding.payload_digest is None:
        return (
            "a replayed response under our key from a provider that does not check the payload "
            "may answer someone else's request"
        )
    return None


def admit(contract: Contract | None, claim: Claim, outcome: Outcome) -> Outcome:
    """What an attempt's outcome may count as, before it is recorded (rules 1, 2, 11).

    A confirmation that names another key, target or body, or lacks what the provider's
    responses bind, confirms nothing: it becomes ambiguous. A refusal saying the target is
    already in the state we asked for is ambiguous after an earlier attempt that may have
    applied. Without a contract (the ledger's own API) only the binding is checked. With a
    keyed contract, the outcome records the scope the attempt was sent into.
    """
    if contract is not None and contract.idempotency.kind == "keyed":
        outcome = outcome.model_copy(
            update={"detail": {**outcome.detail, "scope": contract.idempotency.scope}}
        )
    if isinstance(outcome, Confirmed):
        b = outcome.binding
        clashes = binding_clashes(b, claim.operation, claim.idempotency_key)
        if clashes:
            return Ambiguous(
                code=BINDING_MISMATCH,
                reason=f"the receipt binds another {', '.join(clashes)}",
                detail={"receipt": outcome.model_dump(mode="json")},
            )
        why = (
            _unbound(contract, b, bool(outcome.detail.get("replayed")))
            if contract is not None
            else None
        )
        if why is not None:
            return Ambiguous(
                code=UNBOUND_RESPONSE,
                reason=why,
                detail={"receipt": outcome.model_dump(mode="json")},
            )
        return outcome
    if isinstance(outcome, Rejected) and outcome.conflicting_state and claim.attempt_n > 1:
        return Ambiguous(
            code=STATE_CONFLICT,
            reason=f"{outcome.reason}: after an earlier attempt that may have applied, this "
            "is as likely our own effect as a refusal",
            detail={**outcome.detail, "refusal": outcome.code, "conflicting_state": True},
        )
    return outcome


def binds(
    evidence: Evidence,
    operation: Operation,
    keys: frozenset[str],
    contract: Contract | None = None,
) -> bool:
    """Rule 1: the evidence names this operation (our key or our receipt) and contradicts
    neither its target nor its payload; a success response from dispatch also carries what
    the contract says the provider's responses bind."""
    b = evidence.binding
    ours = (b.idempotency_key is not None and b.idempotency_key in keys) or (
        b.receipt_id is not None and b.receipt_id == operation.provider_result_id
    )
    if not (
        ours
        and (b.target is None or b.target == operation.target)
        and (b.payload_digest is None or b.payload_digest == operation.payload_digest)
    ):
        return False
    if (
        contract is not None
        and evidence.source == DISPATCH
        and evidence.verdict == Verdict.CONFIRMED
    ):
        return _unbound(contract, b, bool(evidence.detail.get("replayed"))) is None
    if contract is not None and evidence.verdict == Verdict.CONFIRMED:
        # an answer from what the provider keeps under a key (its key store, or a status
        # API by our key, deduplicating or not) may be someone else's request under that
        # key: only the body's digest tells, unless the provider refuses another body under
        # a used key. A search finds our own marker, not a key anyone could reuse.
        idem = contract.idempotency
        by_key = idem.kind == "keyed" or contract.lookup.kind == "status_api"
        checked = idem.kind == "keyed" and idem.payload_checked
        return not by_key or checked or b.payload_digest is not None
    return True


def attempt_codes(evidence: Sequence[Evidence]) -> dict[int, str]:
    """The code each attempt's own outcome carried (from its dispatch evidence)."""
    return {
        ev.attempt_n: _code(ev)
        for ev in evidence
        if ev.source == DISPATCH and ev.attempt_n is not None
    }


def sent_attempts(
    contract: Contract, attempts: Sequence[Attempt], evidence: Sequence[Evidence]
) -> list[Attempt]:
    """The attempts that may have reached the provider and executed there: not those that
    provably sent nothing, nor, where the contract says the provider refuses a concurrent
    request with our key, those it refused because another was executing."""
    codes = attempt_codes(evidence)
    skipped = {NOT_SENT, IN_FLIGHT} if contract.idempotency.concurrent == "conflict" else {NOT_SENT}
    return [a for a in attempts if codes.get(a.n) not in skipped]


def in_flight_until(
    contract: Contract, attempts: Sequence[Attempt], evidence: Sequence[Evidence]
) -> datetime | None:
    """Until when an earlier request may still be executing at the provider (rule 3).

    Each attempt that may have been sent counts to its deadline. Where the contract says
    the provider refuses a concurrent request, its "a request with this key is executing"
    answer proves one was still running when it came, so nothing is sent before one lookup
    interval after it; where it says it does not, such an answer is an attempt like any
    other.
    """
    ends = [a.deadline_at for a in sent_attempts(contract, attempts, evidence)]
    if contract.idempotency.concurrent == "conflict":
        ends += [
            ev.recorded_at + max(contract.lookup.interval, timedelta(seconds=1))
            for ev in evidence
            if ev.source == DISPATCH and _code(ev) == IN_FLIGHT
        ]
    return max(ends, default=None)


def _key_first_used(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
) -> datetime | None:
    uses = [
        a.started_at
        for a in sent_attempts(contract, attempts, evidence)
        if a.idempotency_key == operation.idempotency_key
    ]
    return min(uses, default=None)


def retention_risk(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    now: datetime,
) -> str | None:
    """Rule 4: why the provider may have forgotten our key by now, or None."""
    retention = contract.idempotency.retention
    first_use = _key_first_used(contract, operation, attempts, evidence)
    if retention is None or first_use is None:
        return None
    if now + contract.retention_margin >= first_use + retention:
        return (
            f"the key was first used at {first_use.isoformat(timespec='seconds')} and the "
            f"provider keeps keys {human(retention)}; it may have been forgotten"
        )
    return None


def same_key_retry_risk(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    now: datetime,
) -> str | None:
    """Why sending again with our key could apply the change a second time, or None when
    the provider's deduplication covers it (rules 4, 7, 10). The review's consequences
    are derived from the same answer."""
    idem = contract.idempotency
    if idem.kind == "none":
        return "the provider does not deduplicate: a retry could repeat the effect"
    if _key_first_used(contract, operation, attempts, evidence) is None:
        return None  # the provider never saw this key
    expired = retention_risk(contract, operation, attempts, evidence, now)
    if expired is not None:
        return expired
    scopes = {
        str(ev.detail["scope"]) for ev in evidence if ev.source == DISPATCH and "scope" in ev.detail
    }
    if scopes - {idem.scope}:
        return (
            f"earlier attempts went to {', '.join(sorted(scopes))} and this one would go to "
            f"{idem.scope or 'another scope'}; a key is deduplicated only within one scope"
        )
    if not idem.keys_durable:
        return "the provider's key store does not survive a restart: it may have forgotten the key"
    if idem.after_error == "key_released" and any(
        a.outcome not in ("confirmed", "rejected")
        for a in sent_attempts(contract, attempts, evidence)
    ):
        return (
            "the provider releases a key when a request fails, possibly after applying the "
            "change, and an earlier attempt's outcome was never read"
        )
    return None


def decide(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorization: Authorization | None,
    now: datetime,
    policy: ReviewPolicy | None = None,
) -> Decision:
    """What to do next with `operation`, given everything known about it at `now`.

    `policy` hands it to a person sooner than the contract alone would: after
    `policy.after_attempts` attempts, or while it is still waiting or looking
    `policy.after` since its first attempt (unless an operator asked for this retry).
    """
    if operation.status.final:
        raise ValueError(f"{operation.id} is {operation.status}: there is nothing to decide")
    if policy is not None and policy.after_attempts < contract.max_attempts:
        contract = contract.model_copy(update={"max_attempts": policy.after_attempts})
    decision = _decide(contract, operation, attempts, evidence, authorization, now)
    if (
        policy is not None
        and isinstance(decision, Wait | HoldUnknown | AskProvider)
        and attempts
        and operation.operator_retry_by is None
        and now - min(a.started_at for a in attempts) > policy.after
    ):
        return NeedsReview(reason=f"still unknown {human(policy.after)} after the first attempt")
    return decision


def _decide(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorization: Authorization | None,
    now: datetime,
) -> Decision:
    keys = our_keys(operation, attempts)
    authorized = authorization is not None and authorization.active_at(now)
    sent = sent_attempts(contract, attempts, evidence)

    # Rule 1: confirm only on evidence that binds this operation.
    for ev in evidence:
        if ev.verdict == Verdict.CONFIRMED and binds(ev, operation, keys, contract):
            return Confirm(evidence_id=ev.id)
    # Rule 2: reject only on a definitive refusal of this very request.
    for ev in evidence:
        if ev.verdict == Verdict.REJECTED and _rejects(
            ev, operation, keys, contract, sent, evidence
        ):
            return Reject(evidence_id=ev.id)

    busy_until = in_flight_until(contract, attempts, evidence)
    if not sent:
        # Nothing ever executed at the provider: no attempt yet, or each one provably sent
        # nothing (a refused connection, a send window that had passed) or was refused
        # because another request with our key was executing.
        if not authorized:  # Rule 8
            return NeedsReview(reason="authorization revoked before anything was sent")
        if busy_until is not None and now < busy_until:  # Rule 3
            return Wait(until=busy_until)
        if operation.status is Status.PREPARED or attempts:
            by_attempt = attempt_codes(evidence)
            unsent = sum(1 for a in attempts if by_attempt.get(a.n) == NOT_SENT)
            if unsent >= contract.max_attempts:
                return NeedsReview(reason=f"{unsent} attempts, none of which reached the provider")
            return _send(contract, operation)
        return NeedsReview(reason=f"{operation.status} with no attempt on record")

    operator_retry = operation.operator_retry_by is not None
    codes = {_code(ev) for ev in evidence if ev.source == DISPATCH}
    if IDEMPOTENCY_MISMATCH in codes and not operator_retry:
        return NeedsReview(reason="the provider says this key was used with a different payload")

    assert busy_until is not None

    # Rule 3: never start a second attempt while an earlier one may still be in flight.
    if now < busy_until:
        if contract.lookup.kind == "status_api" and not _recent_lookup(evidence, now, contract):
            return AskProvider()
        return Wait(until=busy_until)

    # A person resolved the review with "retry" and saw what it could cause (a key past
    # its retention needed their explicit new key). Authority is still re-checked (rule 8).
    if operator_retry:
        if not authorized:
            return NeedsReview(reason="authorization revoked; the operator's retry was not sent")
        return _send(contract, operation)

    after_deadline = [ev for ev in evidence if ev.source == LOOKUP and ev.recorded_at >= busy_until]
    latest = max(after_deadline, key=lambda ev: ev.recorded_at, default=None)

    if contract.lookup.kind == "status_api":
        if latest is None:
            return AskProvider()
        if latest.verdict == Verdict.PENDING:
            # The provider still executes it: a retry now would race it.
            return _hold_or_lookup(
                evidence, now, contract, "the provider reports it still in progress"
            )
        if latest.verdict == Verdict.ABSENT and binds_key(latest, keys):
            # Rule 6: an authoritative "no such request" after the deadline proves it never
            # took effect; a retry is safe if the other rules allow one.
            return _retry(contract, operation, attempts, evidence, authorized, now, True)
        # An inconclusive status answer is no proof: ask again later, then a person.
        return _hold_or_review(contract, sent, now, "the status API gave no binding answer")

    if contract.lookup.kind == "search":
        # Rule 6: absence in an eventually consistent search proves nothing.
        visible_after = busy_until + contract.lookup.lag
        if now < visible_after:
            return HoldUnknown(next_check=visible_after, reason="waiting for search to catch up")
        if latest is None or latest.recorded_at < visible_after:
            return AskProvider()

    return _retry(contract, operation, attempts, evidence, authorized, now, False)


def _rejects(
    ev: Evidence,
    operation: Operation,
    keys: frozenset[str],
    contract: Contract,
    sent: Sequence[Attempt],
    evidence: Sequence[Evidence],
) -> bool:
    """Rules 2 and 11: the refusal binds this operation, covers every attempt that may have
    applied, and is not a conflicting state our own earlier attempt may have caused."""
    if not binds(ev, operation, keys, contract):
        return False
    if ev.detail.get("conflicting_state") and len(sent) > 1:
        return False
    if ev.source == DISPATCH:
        # a refusal of one attempt says nothing of a later one that may have applied, nor
        # of an earlier one, unless the earlier one went under the same key and the key
        # protected it (the provider would have answered from it, not refused)
        if ev.attempt_n is None or any(a.n > ev.attempt_n for a in sent):
            return False
        refused = next((a for a in sent if a.n == ev.attempt_n), None)
        earlier = [a for a in sent if a.n < ev.attempt_n]
        if not earlier:
            return True
        return (
            refused is not None
            and all(a.idempotency_key == refused.idempotency_key for a in earlier)
            and same_key_retry_risk(contract, operation, earlier, evidence, ev.recorded_at) is None
        )
    # a lookup by key speaks for the attempts sent with that key only
    return all(a.idempotency_key == ev.binding.idempotency_key for a in sent)


def _send(contract: Contract, operation: Operation) -> Decision:
    """Dispatch with our key, unless the provider would refuse the key itself."""
    limit = contract.idempotency.max_key_length
    key = operation.idempotency_key
    if contract.idempotency.kind == "keyed" and limit is not None and len(key) > limit:
        return NeedsReview(
            reason=f"our key {key!r} is {len(key)} characters; the provider accepts at most "
            f"{limit}, so it was not sent"
        )
    return Dispatch(idempotency_key=key, payload_digest=operation.payload_digest)


def binds_key(evidence: Evidence, keys: frozenset[str]) -> bool:
    return evidence.binding.idempotency_key is not None and evidence.binding.idempotency_key in keys


def _retry(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorized: bool,
    now: datetime,
    proven_absent: bool,
) -> Decision:
    """Nothing is in flight and no evidence settles it: may we send again?"""
    if not authorized:  # Rule 8: revoked authority stops new writes.
        return NeedsReview(
            reason="authorization revoked; the outcome of the last attempt is unknown"
        )
    sent = sent_attempts(contract, attempts, evidence)
    if len(sent) >= contract.max_attempts:
        return NeedsReview(reason=f"{len(sent)} attempts left it unknown")
    idem = contract.idempotency
    if idem.kind == "none":
        if proven_absent:
            return _send(contract, operation)
        # Rule 7: no dedup and no decisive lookup.
        return NeedsReview(
            reason="the provider neither deduplicates nor answers authoritatively; "
            "a retry could repeat the effect"
        )
    # Rule 4: same key, same frozen payload, only inside the retention window, even when
    # the provider says it never saw the request (its records of keys end there too).
    expired = retention_risk(contract, operation, attempts, evidence, now)
    if expired is not None:
        return NeedsReview(reason=f"{expired}; a retry could create a new effect")
    if proven_absent:
        return _send(contract, operation)
    # Rule 10: a key the provider may have dropped protects nothing.
    risk = same_key_retry_risk(contract, operation, attempts, evidence, now)
    if risk is not None:
        return NeedsReview(reason=f"{risk}; a retry could create a new effect")
    dispatch_evidence = [ev for ev in evidence if ev.source == DISPATCH]
    if idem.failed_attempt_poisons_key and any(
        _code(ev) == KEY_POISONED for ev in dispatch_evidence
    ):
        return NeedsReview(
            reason="the provider refuses this key after a failed attempt and wants a new one"
        )
    # Rule 5: a replayed stored error is not new information, and a provider that stores
    # errors will replay the one it has: retrying the same key cannot learn more.
    if any(ev.detail.get("replayed") for ev in dispatch_evidence):
        return NeedsReview(reason="the provider replays a stored error for this key")
    if idem.after_error == "replayed" and any(
        _code(ev) == SERVER_ERROR for ev in dispatch_evidence
    ):
        return NeedsReview(
            reason="the provider stored a server error for this key; retrying replays it"
        )
    return _send(contract, operation)


def _code(ev: Evidence) -> str:
    code = ev.detail.get("code")
    return code if isinstance(code, str) else ""


def _recent_lookup(evidence: Sequence[Evidence], now: datetime, contract: Contract) -> bool:
    return any(
        ev.source == LOOKUP and now - ev.recorded_at < contract.lookup.interval for ev in evidence
    )


def _hold_or_lookup(
    evidence: Sequence[Evidence], now: datetime, contract: Contract, reason: str
) -> Decision:
    if _recent_lookup(evidence, now, contract):
        last = max(ev.recorded_at for ev in evidence if ev.source == LOOKUP)
        return HoldUnknown(next_check=last + contract.lookup.interval, reason=reason)
    return AskProvider()


def _hold_or_review(
    contract: Contract, sent: Sequence[Attempt], now: datetime, reason: str
) -> Decision:
    last = max(sent, key=lambda a: a.n)
    give_up = last.deadline_at + max(contract.lookup.interval * 3, timedelta(seconds=1))
    if now >= give_up:
        return NeedsReview(reason=reason)
    return HoldUnknown(next_check=min(now + contract.lookup.interval, give_up), reason=reason)
