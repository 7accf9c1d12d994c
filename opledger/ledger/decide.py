"""The retry decision: a pure function of the contract, the history and the time.

No I/O and no clock reads: everything it needs is passed in, so it can be tested over
generated histories. Each rule of the design is marked where it is applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .contract import Contract
from .models import Attempt, Authorization, Evidence, Operation, Record, Status

# Codes an adapter uses for outcomes the decision treats specially.
IDEMPOTENCY_MISMATCH = "idempotency_mismatch"  #: the key was used with another payload
KEY_POISONED = "key_poisoned"  #: the provider wants a new key after a failed attempt
SERVER_ERROR = "server_error"  #: a 5xx without a dedup guarantee
IN_FLIGHT = "in_flight"  #: the provider says a request with this key is still executing

#: the outcome of an attempt whose claim's send-by window had passed: nothing was sent
NOT_SENT = "not_sent"

#: lookup verdicts
CONFIRMED, REJECTED = "confirmed", "rejected"
ABSENT = "absent"  #: an authoritative status API says it never saw this request
PENDING = "pending"  #: the provider says the request is still executing
INCONCLUSIVE = "inconclusive"  #: nothing that binds this operation either way


class Dispatch(Record):
    """Send (again) now, with this key and the frozen payload whose digest is given."""

    key: str
    payload_digest: str


class Wait(Record):
    """An earlier attempt may still be in flight: nothing may be sent before `until`."""

    until: datetime


class Lookup(Record):
    """Ask the provider for evidence now."""


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


class Review(Record):
    """Nothing automatic can resolve it safely: a person decides."""

    reason: str


Decision = Dispatch | Wait | Lookup | Confirm | Reject | HoldUnknown | Review


def binds(evidence: Evidence, operation: Operation, keys: frozenset[str]) -> bool:
    """Rule 1: the evidence names this operation (our key or our receipt) and contradicts
    neither its target nor its payload."""
    b = evidence.binding
    ours = (b.key is not None and b.key in keys) or (
        b.receipt_id is not None and b.receipt_id == operation.provider_result_id
    )
    return (
        ours
        and (b.target is None or b.target == operation.target)
        and (b.payload_digest is None or b.payload_digest == operation.payload_digest)
    )


def decide(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorization: Authorization | None,
    now: datetime,
) -> Decision:
    """What to do next with `operation`, given everything known about it at `now`."""
    if operation.status.final:
        raise ValueError(f"{operation.id} is {operation.status}: there is nothing to decide")
    keys = frozenset({operation.provider_request_id, *(a.key for a in attempts)})
    authorized = authorization is not None and authorization.active_at(now)

    # Rule 1: confirm only on evidence that binds this operation.
    for ev in evidence:
        if ev.verdict == CONFIRMED and binds(ev, operation, keys):
            return Confirm(evidence_id=ev.id)
    # Rule 2: reject only on a definitive refusal of this very request.
    for ev in evidence:
        if ev.verdict == REJECTED and binds(ev, operation, keys):
            return Reject(evidence_id=ev.id)

    if not attempts:
        if operation.status is Status.PREPARED and authorized:
            return Dispatch(
                key=operation.provider_request_id, payload_digest=operation.payload_digest
            )
        if not authorized:  # Rule 8
            return Review(reason="authorization revoked before anything was sent")
        return Review(reason=f"{operation.status} with no attempt on record")

    # -- send-by window (issue 12): an attempt recorded as not sent carried no request, so
    # it is never in flight; when no attempt sent anything, this is still a first send.
    sent = [a for a in attempts if a.outcome != NOT_SENT]
    if not sent:
        if not authorized:  # Rule 8
            return Review(reason="authorization revoked before anything was sent")
        if len(attempts) >= contract.max_attempts:
            return Review(reason=f"{len(attempts)} claims passed their send-by window unsent")
        return Dispatch(key=operation.provider_request_id, payload_digest=operation.payload_digest)
    # -- end send-by window

    operator_retry = operation.operator_retry_by is not None
    codes = {_code(ev) for ev in evidence if ev.source == "dispatch"}
    if IDEMPOTENCY_MISMATCH in codes and not operator_retry:
        return Review(reason="the provider says this key was used with a different payload")

    last = max(attempts, key=lambda a: a.n)
    first_use = min(
        (a.started_at for a in attempts if a.key == operation.provider_request_id),
        default=last.started_at,
    )
    in_flight_until = max(a.deadline_at for a in sent)

    # Rule 3: never start a second attempt while an earlier one may still be in flight.
    if now < in_flight_until:
        if contract.lookup.kind == "status_api" and not _recent_lookup(evidence, now, contract):
            return Lookup()
        return Wait(until=in_flight_until)

    # A person resolved the review with "retry" and saw what it could cause (a key past
    # its retention needed their explicit new key). Authority is still re-checked (rule 8).
    if operator_retry:
        if not authorized:
            return Review(reason="authorization revoked; the operator's retry was not sent")
        return Dispatch(key=operation.provider_request_id, payload_digest=operation.payload_digest)

    after_deadline = [
        ev for ev in evidence if ev.source == "lookup" and ev.recorded_at >= in_flight_until
    ]
    latest = max(after_deadline, key=lambda ev: ev.recorded_at, default=None)

    if contract.lookup.kind == "status_api":
        if latest is None:
            return Lookup()
        if latest.verdict == PENDING:
            # The provider still executes it: a retry now would race it.
            return _hold_or_lookup(
                evidence, now, contract, "the provider reports it still in progress"
            )
        if latest.verdict == ABSENT and binds_key(latest, keys):
            # Rule 6: an authoritative "no such request" after the deadline proves it never
            # took effect; a retry is safe if the other rules allow one.
            return _retry(
                contract,
                operation,
                attempts,
                evidence,
                authorized,
                first_use,
                now,
                proven_absent=True,
            )
        # An inconclusive status answer is no proof: ask again later, then a person.
        return _hold_or_review(contract, last, now, "the status API gave no binding answer")

    if contract.lookup.kind == "search":
        # Rule 6: absence in an eventually consistent search proves nothing.
        visible_after = in_flight_until + contract.lookup.lag
        if now < visible_after:
            return HoldUnknown(next_check=visible_after, reason="waiting for search to catch up")
        if latest is None or latest.recorded_at < visible_after:
            return Lookup()

    return _retry(
        contract, operation, attempts, evidence, authorized, first_use, now, proven_absent=False
    )


def binds_key(evidence: Evidence, keys: frozenset[str]) -> bool:
    return evidence.binding.key is not None and evidence.binding.key in keys


def _retry(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
    authorized: bool,
    first_use: datetime,
    now: datetime,
    *,
    proven_absent: bool,
) -> Decision:
    """Nothing is in flight and no evidence settles it: may we send again?"""
    if not authorized:  # Rule 8: revoked authority stops new writes.
        return Review(reason="authorization revoked; the outcome of the last attempt is unknown")
    if len(attempts) >= contract.max_attempts:
        return Review(reason=f"{len(attempts)} attempts left it unknown")
    idem = contract.idempotency
    if idem.kind == "none":
        if proven_absent:
            return Dispatch(
                key=operation.provider_request_id, payload_digest=operation.payload_digest
            )
        # Rule 7: no dedup and no decisive lookup.
        return Review(
            reason="the provider neither deduplicates nor answers authoritatively; "
            "a retry could repeat the effect"
        )
    # Rule 4: same key, same frozen payload, only inside the retention window.
    assert idem.retention is not None
    if now + contract.retention_margin >= first_use + idem.retention:
        return Review(
            reason=f"the key was first used at {first_use.isoformat()} and the provider "
            f"keeps keys {idem.retention}; a retry could create a new effect"
        )
    if proven_absent:
        return Dispatch(key=operation.provider_request_id, payload_digest=operation.payload_digest)
    dispatch_evidence = [ev for ev in evidence if ev.source == "dispatch"]
    if idem.failed_attempt_poisons_key and any(
        _code(ev) == KEY_POISONED for ev in dispatch_evidence
    ):
        return Review(
            reason="the provider refuses this key after a failed attempt and wants a new one"
        )
    # Rule 5: a replayed stored error is not new information, and a provider that stores
    # errors will replay the one it has: retrying the same key cannot learn more.
    if any(ev.detail.get("replayed") for ev in dispatch_evidence):
        return Review(reason="the provider replays a stored error for this key")
    if idem.errors_replayed and any(_code(ev) == SERVER_ERROR for ev in dispatch_evidence):
        return Review(reason="the provider stored a server error for this key; retrying replays it")
    return Dispatch(key=operation.provider_request_id, payload_digest=operation.payload_digest)


def _code(ev: Evidence) -> str:
    code = ev.detail.get("code")
    return code if isinstance(code, str) else ""


def _recent_lookup(evidence: Sequence[Evidence], now: datetime, contract: Contract) -> bool:
    return any(
        ev.source == "lookup" and now - ev.recorded_at < contract.lookup.interval for ev in evidence
    )


def _hold_or_lookup(
    evidence: Sequence[Evidence], now: datetime, contract: Contract, reason: str
) -> Decision:
    if _recent_lookup(evidence, now, contract):
        last = max(ev.recorded_at for ev in evidence if ev.source == "lookup")
        return HoldUnknown(next_check=last + contract.lookup.interval, reason=reason)
    return Lookup()


def _hold_or_review(contract: Contract, last: Attempt, now: datetime, reason: str) -> Decision:
    give_up = last.deadline_at + max(contract.lookup.interval * 3, timedelta(seconds=1))
    if now >= give_up:
        return Review(reason=reason)
    return HoldUnknown(next_check=min(now + contract.lookup.interval, give_up), reason=reason)
