"""What each possible review resolution could cause, derived from the provider's contract.

Pure: the reviewer is shown this text, and the same text is stored with the audit row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .contract import Contract
from .evidence import sent_attempts
from .models import Attempt, Evidence, Operation, Record
from .risk import human, in_flight_until, same_key_retry_risk


class Consequences(Record):
    """One sentence per resolution, plus whether a same-key retry is still allowed."""

    confirmed: str
    rejected: str
    retry: str
    retry_new_key: str
    cancel: str
    same_key_retry_allowed: bool
    key_age: timedelta | None


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def consequences(
    contract: Contract,
    operation: Operation,
    attempts: Sequence[Attempt],
    now: datetime,
    evidence: Sequence[Evidence] = (),
) -> Consequences:
    """Describe what confirming, rejecting, retrying (same key or new) and cancelling could do.

    Whether a same-key retry is protected is the retry decision's own answer
    (`same_key_retry_risk`), so the text never promises a protection the contract lacks.
    """
    noun = contract.effect
    idem = contract.idempotency
    key = operation.idempotency_key
    uses = [
        a.started_at
        for a in sent_attempts(contract, attempts, evidence)
        if a.idempotency_key == key
    ]
    key_age = now - min(uses) if uses else None
    busy_until = in_flight_until(contract, attempts, evidence)
    wait = (
        f" It will not be sent before {busy_until.isoformat(timespec='seconds')}, while "
        "an earlier attempt may still be in flight."
        if busy_until is not None and busy_until > now
        else ""
    )
    custody = (
        " A success from this provider means it accepted the message, not that it was delivered."
        if contract.success_proves == "accepted"
        else ""
    )
    risk = same_key_retry_risk(contract, operation, attempts, evidence, now)
    retry = _same_key_retry(contract, risk, key_age) + wait + custody
    new_key = retry if idem.kind == "none" else _new_key_retry(contract, key_age) + wait
    return Consequences(
        confirmed=(
            f"Records the {noun} as done without provider proof that binds this operation; if "
            "it did not happen, nothing will send it."
        ),
        rejected=(
            f"Records the {noun} as not done; if an earlier attempt did take effect, the ledger "
            "will be wrong and a new intent for the same change could repeat it."
        ),
        retry=retry,
        retry_new_key=new_key,
        cancel=(
            f"Stops every further attempt. Whatever an earlier attempt did stays done; undoing "
            f"{_a(noun)} is a new intent of its own (there is no automatic compensation)."
        ),
        same_key_retry_allowed=risk is None,
        key_age=key_age,
    )


def _same_key_retry(contract: Contract, risk: str | None, key_age: timedelta | None) -> str:
    """What a retry under the same key could do (`risk`: why the key does not protect it)."""
    noun = contract.effect
    idem = contract.idempotency
    if idem.kind == "none":
        return (
            "The provider does not deduplicate: if an earlier attempt took effect, retrying "
            f"sends a second {noun}."
        )
    if risk is not None:
        return (
            f"Not protected by the key: {risk}. If an earlier attempt took effect, retrying "
            f"could make a second {noun}; acknowledge that risk to retry."
        )
    assert idem.retention is not None
    kept = (
        f"Retries with the same key; the provider keeps keys {human(idem.retention)}."
        if key_age is None
        else f"Retries with the same key: the provider keeps keys "
        f"{human(idem.retention)} and this key is {human(key_age)} old, so if an "
        f"earlier attempt took effect the provider answers from it and no second "
        f"{noun} is made."
    )
    if idem.after_error == "replayed":
        kept += " It replays stored errors too, so the same error may come back."
    return kept


def _new_key_retry(contract: Contract, key_age: timedelta | None) -> str:
    """What a retry under a new key could do (the provider deduplicates on keys)."""
    retention = contract.idempotency.retention
    return f"Retrying with a new key may send a second {contract.effect}" + (
        f": the provider keeps keys {human(retention)} and this key is {human(key_age)} old."
        if key_age is not None and retention is not None
        else ": the provider cannot connect it to the earlier attempts."
    )


_AFTER_ERROR = {
    "replayed": "stores a failure under the key and replays it",
    "nothing_applied": "applies the change and records the key in one commit, so a failure "
    "leaves nothing applied",
    "rerun_failed": "answers a retry with the first request's current outcome and re-runs "
    "only work that failed",
    "key_released": "releases the key when a request fails, possibly after applying the change",
}


def contract_facts(contract: Contract) -> list[str]:
    """The contract in plain words, one fact a line, for a person deciding a review."""
    idem, lookup = contract.idempotency, contract.lookup
    facts = []
    if idem.kind == "none":
        facts.append("no deduplication: every request the provider receives takes effect")
    else:
        assert idem.retention is not None
        facts += [
            f"deduplicates by our key within {idem.scope or 'an unstated scope'}, "
            f"for {human(idem.retention)}",
            f"on a failure it {_AFTER_ERROR[idem.after_error]}",
            "its key store survives a restart"
            if idem.keys_durable
            else "its key store may be lost on a restart",
            "a used key with another payload is refused"
            if idem.payload_checked
            else "a used key with another payload is not checked",
            "a concurrent request with the same key is refused"
            if idem.concurrent == "conflict"
            else "a concurrent request with the same key may execute too",
        ]
        if idem.failed_attempt_poisons_key:
            facts.append("after a failed attempt it wants a new key")
    facts.append(
        {
            "none": "no lookup: nothing can ask it afterwards what happened",
            "status_api": "an authoritative status API by our key",
            "search": f"a search that may lag {human(lookup.lag)}; absence proves nothing",
        }[lookup.kind]
    )
    facts.append(
        "a success means the message was accepted, not delivered"
        if contract.success_proves == "accepted"
        else "a success means the change was applied"
    )
    facts.append(
        f"a request may still execute up to {human(contract.max_in_flight)} after it was sent"
    )
    return facts
