"""The retry decision: a pure function of the contract, the history and the time.

No I/O and no clock reads: everything it needs is passed in, so it can be tested over
generated histories. Each numbered rule (docs/rules.md) is marked where it is applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import Field

from .contract import Contract
from .evidence import (
    BINDING_MISMATCH,
    DISPATCH,
    IDEMPOTENCY_MISMATCH,
    KEY_POISONED,
    LEDGER_SWITCH,
    LOOKUP,
    SERVER_ERROR,
    UNCODED_REFUSAL,
    _code,
    binds,
    binds_key,
    counted_attempts,
    our_keys,
    own_unsent,
    sent_attempts,
    throttled_until,
)
from .models import (
    Attempt,
    Authorization,
    Evidence,
    Operation,
    Record,
    Status,
    Verdict,
)
from .risk import human, in_flight_until, retention_risk, same_key_retry_risk


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
    return _naming_switch(decision, evidence)


def _naming_switch(decision: Decision, evidence: Sequence[Evidence]) -> Decision:
    """A person asked to decide about an operation a ledger switch quarantined is told so:
    the attempt the ledger may have forgotten is why nothing automatic can settle it."""
    if not isinstance(decision, NeedsReview):
        return decision
    switches = [ev for ev in evidence if ev.source == DISPATCH and _code(ev) == LEDGER_SWITCH]
    if not switches:
        return decision
    switch = switches[-1].detail.get("switch")
    return NeedsReview(
        reason=f"ledger switch #{switch}: the ledger may have forgotten an attempt, and "
        f"{decision.reason}"
    )


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

    settled = _on_evidence(contract, operation, keys, sent, evidence)
    if settled is not None:
        return settled

    # Rule 3, and a provider's "not now": nothing is sent before an earlier request may
    # have finished, nor before the wait the provider asked for has passed.
    busy_until = _later(
        in_flight_until(contract, attempts, evidence), throttled_until(contract, evidence)
    )
    if not sent:
        return _never_sent(contract, operation, attempts, evidence, authorized, busy_until, now)

    operator_retry = operation.operator_retry_by is not None
    taken = _key_taken(operation, evidence)
    if taken is not None:
        return taken

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
        return _on_status(contract, operation, attempts, evidence, latest, authorized, now, sent)
    if contract.lookup.kind == "search":
        waiting = _on_search(contract, latest, busy_until, now)
        if waiting is not None:
            return waiting
    return _retry(contract, operation, attempts, evidence, authorized, now, False)


def _on_search(
    contract: Contract, latest: Evidence | None, busy_until: datetime, now: datetime
) -> Decision | None:
    """Rule 6: absence in an eventually consistent search proves nothing before its lag has
    passed since the in-flight deadline (`busy_until`); a lookup that reads something up to
    date first is asked at once, its absence waiting like any. None: the lookups are done."""
    visible_after = busy_until + contract.lookup.lag
    if now < visible_after:
        if contract.lookup.read_after_write and latest is None:
            return AskProvider()  # a fresh read may find it now; its absence waits
        return HoldUnknown(next_check=visible_after, reason="waiting for search to catch up")
    if latest is None or latest.recorded_at < visible_after:
        return AskProvider()
    return None


def _key_taken(operation: Operation, evidence: Sequence[Evidence]) -> NeedsReview | None:
    """Rule 12: the provider answered our key with another request's answer (or may have):
    the key no longer protects this operation, and a retry under it gets that answer again
    while a new key could repeat the effect. A person decides at once, unless one already
    did and asked for this retry."""
    if operation.operator_retry_by is not None:
        return None
    for ev in evidence:
        if ev.source != DISPATCH:
            continue
        code = _code(ev)
        if code == IDEMPOTENCY_MISMATCH:
            return NeedsReview(
                reason="the provider says this key was used with a different payload"
            )
        if code in (BINDING_MISMATCH, UNCODED_REFUSAL):
            reason = ev.detail.get("reason")
            return NeedsReview(reason=str(reason) if reason else code)
    return None


def _on_evidence(
    contract: Contract,
    operation: Operation,
    keys: frozenset[str],
    sent: Sequence[Attempt],
    evidence: Sequence[Evidence],
) -> Decision | None:
    """Rules 1 and 2: settle on evidence that binds this operation, if there is any."""
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
    return None


def _never_sent(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorized: bool,
    busy_until: datetime | None,
    now: datetime,
) -> Decision:
    """Nothing ever executed at the provider: no attempt yet, or each one provably sent
    nothing (a refused connection, a send window that had passed) or was refused because
    another request with our key was executing."""
    if not authorized:  # Rule 8
        return NeedsReview(reason="authorization revoked before anything was sent")
    if busy_until is not None and now < busy_until:  # Rule 3
        return Wait(until=busy_until)
    if operation.status is Status.PREPARED or attempts:
        # Rule 13 among unsent attempts: those that sent nothing for a reason of our own (a
        # send window that passed); a provider refusing connections or saying "not now" is
        # its state, which its breaker and pause hold back (they never send it to a person)
        unsent = own_unsent(evidence)
        if unsent >= contract.max_attempts:
            return NeedsReview(reason=f"{unsent} attempts, none of which reached the provider")
        return _send(contract, operation)
    return NeedsReview(reason=f"{operation.status} with no attempt on record")


def _on_status(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    latest: Evidence | None,
    authorized: bool,
    now: datetime,
    sent: Sequence[Attempt],
) -> Decision:
    """After the in-flight deadline, on a provider with a status API: what its latest
    answer (`latest`, None before any) allows."""
    if latest is None:
        return AskProvider()
    if latest.verdict == Verdict.PENDING:
        # The provider still executes it: a retry now would race it.
        return _hold_or_lookup(evidence, now, contract, "the provider reports it still in progress")
    if latest.verdict == Verdict.ABSENT and binds_key(latest, our_keys(operation, attempts)):
        # Rule 6: an authoritative "no such request" after the deadline proves it never
        # took effect; a retry is safe if the other rules allow one.
        return _retry(contract, operation, attempts, evidence, authorized, now, True)
    # An inconclusive status answer is no proof: ask again later, then a person.
    return _hold_or_review(contract, sent, now, "the status API gave no binding answer")


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
    counted = counted_attempts(contract, attempts, evidence)
    if len(counted) >= contract.max_attempts:
        return NeedsReview(reason=f"{len(counted)} attempts left it unknown")
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
    replays = [ev for ev in dispatch_evidence if ev.detail.get("replayed")]
    if replays:
        what = replays[-1].detail.get("reason")
        return NeedsReview(
            reason="the provider replays what it stored for this key"
            + (f" ({what})" if what else "")
            + "; retrying the same key cannot learn more"
        )
    if idem.after_error == "replayed" and any(
        _code(ev) == SERVER_ERROR for ev in dispatch_evidence
    ):
        return NeedsReview(
            reason="the provider stored a server error for this key; retrying replays it"
        )
    return _send(contract, operation)


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


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return max(a, b)
