"""What each possible review resolution could cause, derived from the provider's contract.

Pure: the reviewer is shown this text, and the same text is stored with the audit row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .contract import Contract
from .models import Attempt, Operation, Record


class Consequences(Record):
    """One sentence per resolution, plus whether a same-key retry is still allowed."""

    confirmed: str
    rejected: str
    retry: str
    retry_new_key: str
    cancel: str
    same_key_retry_allowed: bool
    key_age: timedelta | None


def effect_noun(action: str) -> str:
    """What the effect is called in a sentence ("a second email")."""
    if action.startswith("email."):
        return "email"
    if ".close_case." in action or ".update_case." in action:
        return "change to the case"
    if action.startswith(("payment.", "charge.", "refund.")):
        return "charge"
    return "effect"


def human(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} d"
    if seconds >= 3600:
        return f"{seconds // 3600} h"
    if seconds >= 60:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def consequences(
    contract: Contract, operation: Operation, attempts: Sequence[Attempt], now: datetime
) -> Consequences:
    """Describe what confirming, rejecting, retrying (same key or new) and cancelling could do."""
    noun = effect_noun(operation.action)
    idem = contract.idempotency
    key = operation.provider_request_id
    uses = [a.started_at for a in attempts if a.key == key]
    key_age = now - min(uses) if uses else None
    in_flight_until = max((a.deadline_at for a in attempts), default=None)
    wait = (
        f" It will not be sent before {in_flight_until.isoformat(timespec='seconds')}, while "
        "an earlier attempt may still be in flight."
        if in_flight_until is not None and in_flight_until > now
        else ""
    )
    custody = (
        " A success from this provider means it accepted the message, not that it was delivered."
        if contract.success_proves == "accepted"
        else ""
    )

    if idem.kind == "none":
        retry = (
            f"The provider does not deduplicate: if an earlier attempt took effect, retrying "
            f"sends a second {noun}.{wait}{custody}"
        )
        allowed = True
    else:
        assert idem.retention is not None
        if key_age is None:
            retry = (
                f"Retries with the same key; the provider keeps keys {human(idem.retention)}.{wait}"
            )
            allowed = True
        elif key_age + contract.retention_margin < idem.retention:
            retry = (
                f"Retries with the same key: the provider keeps keys {human(idem.retention)} and "
                f"this key is {human(key_age)} old, so if an earlier attempt took effect the "
                f"provider answers from it and no second {noun} is made."
                + (
                    " It replays stored errors too, so the same error may come back."
                    if idem.errors_replayed
                    else ""
                )
                + wait
                + custody
            )
            allowed = True
        else:
            retry = (
                f"Not allowed with the same key: the provider keeps keys {human(idem.retention)} "
                f"and this key is {human(key_age)} old; it may have been forgotten, and a retry "
                f"could create a second {noun}. Acknowledge with a new key instead."
            )
            allowed = False
    if idem.kind == "none":
        new_key = retry
    else:
        new_key = (
            f"Retrying with a new key may send a second {noun}"
            + (
                f": the provider keeps keys {human(idem.retention)} and this key is "
                f"{human(key_age)} old."
                if key_age is not None and idem.retention is not None
                else ": the provider cannot connect it to the earlier attempts."
            )
            + wait
        )
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
            f"Stops every further attempt. Whatever an earlier attempt did stays done; undoing a "
            f"{noun} is a new intent of its own (there is no automatic compensation)."
        ),
        same_key_retry_allowed=allowed,
        key_age=key_age,
    )
