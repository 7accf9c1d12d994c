"""What a retry could cause: until when an earlier request may still execute, and why a
same-key retry could apply the change again (rules 3, 4, 7, 10). Pure; the decision, the
review's consequences and its checks all read the same answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .contract import Contract
from .evidence import DISPATCH, IN_FLIGHT, _code, sent_attempts
from .models import (
    Attempt,
    Evidence,
    Operation,
)


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
