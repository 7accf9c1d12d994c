"""Evidence: what binds an operation, and what an attempt's outcome may count as.

Pure, like the decision that reads it: which keys are ours, whether a receipt or a lookup
binds this operation (rule 1), what `admit` lets an outcome count as before it is recorded
(rules 1, 2, 11), and which attempts may have reached the provider.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from .canonical import canonicalize
from .contract import Contract, Limits
from .errors import InvalidInput
from .models import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Evidence,
    EvidenceSource,
    Operation,
    Outcome,
    Rejected,
    Verdict,
)

# Codes an adapter (or `admit`) uses for outcomes the decision treats specially.
IDEMPOTENCY_MISMATCH = "idempotency_mismatch"  #: the key was used with another payload
KEY_POISONED = "key_poisoned"  #: the provider wants a new key after a failed attempt
SERVER_ERROR = "server_error"  #: a 5xx (or a failure the provider reported) after sending
IN_FLIGHT = "in_flight"  #: the provider refused this attempt: one with the key is executing
NOT_SENT = "not_sent"  #: provably nothing reached the provider (refused connection, window)
#: the provider said "not now" (HTTP 429, a 503 with Retry-After, a documented overload
#: code); `detail["retry_after_s"]` says how long it asked us to wait
THROTTLED = "throttled"
#: `detail["why"]` of a NOT_SENT attempt whose connection was never made (refused, timed
#: out while connecting): a fact about the provider, which its breaker counts. Adapters say
#: it with `unreached`, and the rules read it with `never_reached`.
NO_CONNECTION = "no_connection"
#: what an earlier release recorded for an MCP upstream it could not connect to: the same
#: fact, read as NO_CONNECTION (ledgers keep their evidence)
_NOT_CONNECTED = "not_connected"
#: an attempt the ledger may have forgotten: a switch (a failover to a standby that was
#: behind, a restore) took back what it knew after the operation's last change it kept
#: (`opledger.ledger.switches`); it may have been sent, under the operation's key
LEDGER_SWITCH = "ledger_switch"
STATE_CONFLICT = "state_conflict"  #: a refusal our own earlier attempt may have caused
BINDING_MISMATCH = "binding_mismatch"  #: a receipt that names another key, target or body
UNBOUND_RESPONSE = "unbound_response"  #: a success that does not show it answers our request
#: a keyed request refused with a status an idempotency layer also uses for our key (422:
#: the key carries another body) and no error code that tells which
UNCODED_REFUSAL = "uncoded_refusal"

DISPATCH, LOOKUP = EvidenceSource.DISPATCH, EvidenceSource.LOOKUP

#: the largest result document (canonical JSON bytes) kept with a piece of evidence
RESULT_LIMIT = 4096


def with_result(
    detail: Mapping[str, Any], result: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`detail` with the provider's result document under "result" (`result`, else one
    the adapter put in the detail itself), bounded: a document that is not a JSON object,
    cannot be canonicalized or is over `RESULT_LIMIT` bytes is replaced by a note saying
    so. The evidence is kept whatever the document was; only the document is dropped."""
    out = dict(detail)
    doc = result if result is not None else out.get("result")
    if doc is None:
        return out
    if not isinstance(doc, Mapping):
        out["result"] = {"omitted": f"a result must be a JSON object, not {type(doc).__name__}"}
        return out
    try:
        frozen = canonicalize(doc, max_bytes=RESULT_LIMIT)
    except InvalidInput as exc:
        size = exc.fields.get("size")
        note: dict[str, Any] = {"omitted": f"the result was not kept: {exc}"[:300]}
        if size is not None:
            note["size"] = size
        out["result"] = note
        return out
    out["result"] = json.loads(frozen.text)
    return out


def _bounded(outcome: Outcome) -> Outcome:
    """A confirmation's result document, bounded (`with_result`), in `result` only."""
    if not isinstance(outcome, Confirmed):
        return outcome
    if outcome.result is None and "result" not in outcome.detail:
        return outcome
    detail = with_result(outcome.detail, outcome.result)
    return outcome.model_copy(update={"result": detail.pop("result"), "detail": detail})


def our_keys(operation: Operation, attempts: Sequence[Attempt]) -> frozenset[str]:
    """Every idempotency key this operation was, or will be, sent under."""
    return frozenset({operation.idempotency_key, *(a.idempotency_key for a in attempts)})


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
    applied, unless the provider replayed it under our key to the second attempt (the
    first request's own refusal, `_first_replayed`). Without a contract (the ledger's own
    API) only the binding is checked. With a keyed contract, the outcome records the scope
    the attempt was sent into.
    """
    outcome = _bounded(outcome)
    if contract is not None and contract.idempotency.kind == "keyed":
        outcome = outcome.model_copy(
            update={"detail": {**outcome.detail, "scope": contract.idempotency.scope}}
        )
    # a replayed answer stays marked as one whatever it is turned into (rule 5 reads it)
    replayed = replayed_answer(outcome)
    if isinstance(outcome, Confirmed):
        b = outcome.binding
        clashes = binding_clashes(b, claim.operation, claim.idempotency_key)
        if clashes:
            return Ambiguous(
                code=BINDING_MISMATCH,
                reason=f"the provider answered our request with a receipt for another one (it "
                f"binds another {', '.join(clashes)})",
                replayed=replayed,
                detail={
                    **_scope_of(outcome),
                    "receipt": outcome.model_dump(mode="json"),
                    "clashes": clashes,
                },
            )
        why = _unbound(contract, b, replayed) if contract is not None else None
        if why is not None:
            return Ambiguous(
                code=UNBOUND_RESPONSE,
                reason=why,
                replayed=replayed,
                detail={**_scope_of(outcome), "receipt": outcome.model_dump(mode="json")},
            )
        return outcome
    if isinstance(outcome, Rejected) and outcome.conflicting_state and claim.attempt_n > 1:
        if replayed and _first_replayed(contract, claim):
            # the answer stored under our key for the one request that carried it before:
            # the first attempt's own refusal, replayed, not a refusal of what it did
            return outcome.model_copy(update={"conflicting_state": False})
        return Ambiguous(
            code=STATE_CONFLICT,
            reason=f"{outcome.reason}: after an earlier attempt that may have applied, this "
            "is as likely our own effect as a refusal",
            replayed=replayed,
            detail={**outcome.detail, "refusal": outcome.code, "conflicting_state": True},
        )
    return outcome


def _first_replayed(contract: Contract | None, claim: Claim) -> bool:
    """A replay on this attempt can only be the first attempt's stored answer: this is the
    second attempt, both under the operation's own key (no operator's retry under a new
    one), to a provider that keys requests and checks each key's body (what it replays
    under our key answered our request, no one else's). A later attempt's replay may be
    the stored answer of a second request that a provider which lost its keys ran afresh,
    and refused because of what the first did."""
    return (
        contract is not None
        and contract.idempotency.kind == "keyed"
        and contract.idempotency.payload_checked
        and claim.attempt_n == 2
        and claim.idempotency_key == claim.operation.marker
    )


#: how a review of a possible duplicate names itself (the start of its reason)
POSSIBLE_DUPLICATE = "possible_duplicate"


def possible_duplicate(
    contract: Contract | None,
    claim: Claim,
    outcome: Outcome,
    attempts: Sequence[Attempt],
    evidence: Sequence[Evidence],
) -> tuple[Attempt, ...]:
    """The earlier attempts a fresh success may have repeated; empty when there are none.

    A provider that marks every replay (`Idempotency.marks_replays`) answers a same-key
    resend of a request it executed with the stored answer, marked. So an admitted
    confirmation (`outcome`, after `admit`) on a later attempt (`claim.attempt_n > 1`) that
    is *not* marked as a replay means the provider ran the request afresh: it no longer
    knew our key (a restart that lost its key store, a key pruned early). Every earlier
    attempt under the same key whose request may have reached the provider and executed
    (`sent_attempts`: not one that provably sent nothing, or was refused as in flight
    where the contract says so) may then have applied it already: the effect may exist
    twice. An authoritative "no such request" by our key (a status API), recorded after an
    earlier attempt's in-flight deadline, proves that attempt applied nothing (rule 6).

    The operation is still confirmed (this attempt's receipt binds it); a person is asked
    to check the earlier attempts. Pure: reads `attempts` and `evidence` as recorded before
    this outcome (the claim's own attempt, if present, is ignored)."""
    if contract is None or not fresh_resend(contract, claim, outcome):
        return ()
    earlier = [
        a
        for a in sent_attempts(contract, attempts, evidence)
        if a.n < claim.attempt_n and a.idempotency_key == claim.idempotency_key
    ]
    absent = _proven_absent(contract, claim.idempotency_key, evidence)
    return tuple(a for a in earlier if absent is None or absent < a.deadline_at)


def fresh_resend(contract: Contract | None, claim: Claim, outcome: Outcome) -> bool:
    """Whether `outcome` is a success the provider did not mark as a replay, on a resend
    (`claim.attempt_n > 1`), from a keyed provider that marks every replay: the part of
    `possible_duplicate` that needs no history (an attempt's first send is never one)."""
    return (
        contract is not None
        and contract.idempotency.kind == "keyed"
        and contract.idempotency.marks_replays
        and claim.attempt_n > 1
        and isinstance(outcome, Confirmed)
        and not replayed_answer(outcome)
    )


def _proven_absent(contract: Contract, key: str, evidence: Sequence[Evidence]) -> datetime | None:
    """When an authoritative status API last said it has no request under `key` (None:
    never). An attempt whose in-flight deadline had passed by then applied nothing."""
    if contract.lookup.kind != "status_api":
        return None
    return max(
        (
            ev.recorded_at
            for ev in evidence
            if ev.source == LOOKUP
            and ev.verdict == Verdict.ABSENT
            and ev.binding.idempotency_key == key
        ),
        default=None,
    )


def _scope_of(outcome: Outcome) -> dict[str, Any]:
    """The key scope the attempt was sent into, kept at the top of whatever it becomes (what
    the retry risk reads)."""
    return {"scope": outcome.detail["scope"]} if "scope" in outcome.detail else {}


def replayed_answer(outcome: Outcome) -> bool:
    """Whether the provider answered from what it stored under our key (a replay)."""
    flagged = isinstance(outcome, Ambiguous) and outcome.replayed
    return flagged or bool(outcome.detail.get("replayed"))


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
    if contract.limits.throttle_applies_nothing:
        skipped.add(THROTTLED)
    return [a for a in attempts if codes.get(a.n) not in skipped]


def counted_attempts(
    contract: Contract, attempts: Sequence[Attempt], evidence: Sequence[Evidence]
) -> list[Attempt]:
    """The attempts that count toward `max_attempts` (rule 13): those that may have reached
    the provider, less those it answered with "not now" (THROTTLED), which say nothing of
    the operation, only of the provider's load."""
    codes = attempt_codes(evidence)
    return [a for a in sent_attempts(contract, attempts, evidence) if codes.get(a.n) != THROTTLED]


def own_unsent(evidence: Sequence[Evidence]) -> int:
    """Attempts that provably sent nothing for a reason of our own (a send window that had
    passed, a temporary refusal of this message): what rule 13 bounds among unsent attempts.
    A connection the provider never accepted is its state, not the operation's: its
    breaker counts those (`opledger.ledger.pressure`); a held attempt (no adapter) is
    bounded by the review policy's time instead."""
    return sum(
        1
        for ev in evidence
        if ev.source == DISPATCH
        and ev.attempt_n is not None
        and _code(ev) == NOT_SENT
        and not never_reached(ev)
        and ev.detail.get("why") != "no_adapter"
    )


def unreached(reason: str, **detail: Any) -> Ambiguous:
    """The outcome of an attempt that never reached the provider: no connection was made,
    or the session failed before the effect's request could leave (refused, unreachable,
    timed out while connecting, a handshake that failed). It is the provider's state, not
    the operation's: the attempt is sent again, its breaker counts it and pauses the
    provider, and it neither counts toward `max_attempts` nor asks a person. Every adapter
    says it this way, so an outage reads the same whatever the transport."""
    return Ambiguous(code=NOT_SENT, reason=reason[:500], detail={**detail, "why": NO_CONNECTION})


def never_reached(outcome: Outcome | Evidence) -> bool:
    """`outcome` (or an attempt's recorded evidence) says its attempt never reached the
    provider (`unreached`)."""
    if isinstance(outcome, Evidence):
        code = _code(outcome)
    else:
        code = outcome.code if isinstance(outcome, Ambiguous) else ""
    return code == NOT_SENT and outcome.detail.get("why") in (NO_CONNECTION, _NOT_CONNECTED)


def asked_wait(detail: Mapping[str, Any], limits: Limits) -> timedelta:
    """How long a "not now" asked us to wait: its Retry-After (`retry_after_s`), else the
    contract's default, never more than its `retry_after_max`."""
    asked = detail.get("retry_after_s")
    most = limits.retry_after_max
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked >= 0:
        # capped as a number first: a wait too long for a timedelta (a date in the year
        # 3000000) is still the longest one taken at its word
        return timedelta(seconds=min(float(asked), most.total_seconds()))
    return min(limits.retry_after_default, most)


def throttled_until(contract: Contract, evidence: Sequence[Evidence]) -> datetime | None:
    """Until when the provider asked us to send nothing for this operation (its latest
    "not now" answers' Retry-After), or None."""
    ends = [
        ev.recorded_at + asked_wait(ev.detail, contract.limits)
        for ev in evidence
        if ev.source == DISPATCH and _code(ev) == THROTTLED
    ]
    return max(ends, default=None)


def binds_key(evidence: Evidence, keys: frozenset[str]) -> bool:
    return evidence.binding.idempotency_key is not None and evidence.binding.idempotency_key in keys


def _code(ev: Evidence) -> str:
    code = ev.detail.get("code")
    return code if isinstance(code, str) else ""


#: what one piece of evidence proves about the effect, in the words `opledger ops show` uses
Proof = Literal["applied", "not applied", "unknown"]


def proves(
    evidence: Evidence,
    operation: Operation,
    attempts: Sequence[Attempt],
    contract: Contract | None = None,
) -> Proof:
    """What `evidence` proves about `operation`'s effect, read as the retry decision reads it.

    - "applied": a confirmation that binds this operation (rule 1), or an operator's
      `confirmed`;
    - "not applied": a definitive refusal that binds this request (rule 2), an operator's
      `rejected`, an attempt that provably sent nothing (`not_sent`), or a status API's
      "no such request" under our key once every attempt before it was past its in-flight
      deadline (rule 6: earlier, the request may still arrive);
    - "unknown" for everything else: an ambiguous outcome, a request still pending, an
      inconclusive lookup (a search that found nothing proves nothing), and any verdict on
      something that does not bind this operation.

    Evidence speaks of the request it answers: a refusal of one attempt says nothing of
    another attempt that may have applied (whether the operation is settled is its status).
    """
    verdict = evidence.verdict
    if evidence.source == EvidenceSource.OPERATOR:  # a person's word, not a binding receipt
        if verdict == Verdict.CONFIRMED:
            return "applied"
        return "not applied" if verdict == Verdict.REJECTED else "unknown"
    keys = our_keys(operation, attempts)
    if verdict == Verdict.CONFIRMED:
        return "applied" if binds(evidence, operation, keys, contract) else "unknown"
    if verdict == Verdict.REJECTED:
        return "not applied" if binds(evidence, operation, keys, contract) else "unknown"
    if verdict == Verdict.AMBIGUOUS:
        code = _code(evidence)
        if code == NOT_SENT or (
            code == THROTTLED and contract is not None and contract.limits.throttle_applies_nothing
        ):
            return "not applied"
        return "unknown"
    if verdict == Verdict.ABSENT and binds_key(evidence, keys):
        earlier = [a.deadline_at for a in attempts if a.started_at <= evidence.recorded_at]
        if all(evidence.recorded_at >= deadline for deadline in earlier):
            return "not applied"
    return "unknown"
