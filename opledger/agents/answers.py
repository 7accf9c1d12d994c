"""What an agent reads back from an effect, whichever way it called (a LangGraph tool, an
MCP tool): how the act stands, a refusal, and the `repeat` argument that asks for a
deliberately repeated act. One wording for every agent surface."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from opledger.ledger import (
    AuthorizationError,
    IntentFieldsUndeclared,
    InvalidInput,
    LedgerError,
    Status,
    UnknownAction,
)
from opledger.ledger.beats import DEFAULT_MISSING_AFTER, BeatSeen

from .results import EffectPending, EffectResult

#: the argument a model sets to ask for a deliberately repeated act: a number, which a
#: model asked again (a replay, a fork) repeats far more faithfully than any wording it
#: would give the reason
REPEAT = "repeat"
REPEAT_HELP = (
    "Leave this out (or null). Only to do again, on purpose, an act this conversation already did "
    "(the tool said so): 2 for the second time, 3 for the third. Never set it to retry, "
    "to correct a call or to get an answer sooner."
)

#: what the ledger refuses because of what a call asked: answered to the model ...
REFUSED = (AuthorizationError, InvalidInput)
#: ... except what no call can fix: an action no adapter serves, undeclared intent fields
UNFIXABLE = (UnknownAction, IntentFieldsUndeclared)


class UnnamedRun(ValueError):
    """An agent framework's effect asked with no run to key it by (no durable workflow,
    conversation or session, and none named): its only ids are the run's and the call's,
    which the next run does not have. Raised, never answered to the model (no call can fix
    it): the run ends rather than an effect be keyed by an id a retry changes."""


def purpose_of(repeat: int | None) -> str | None:
    """The intent's purpose for a `repeat` argument (none for the first time)."""
    return f"repeat {repeat}" if repeat is not None and repeat > 1 else None


def repeat_of(purpose: str | None) -> int:
    """The `repeat` an intent's purpose names (`purpose_of`'s inverse): 1 for the first
    time (no purpose) and for a purpose that names no repeat."""
    found = re.fullmatch(r"repeat ([0-9]+)", (purpose or "").strip().casefold())
    return int(found.group(1)) if found else 1


def summary(
    result: EffectResult, *, repeatable: bool = True, purpose: str | None = None
) -> dict[str, Any]:
    """The result as a model reads it: what it is, how it stands, and a `message` in words.
    `purpose` is the asked intent's (`purpose_of(repeat)`): the act recorded under it is
    that repeat, so a deliberate repeat after it is the next number."""
    op = result.operation
    out: dict[str, Any] = {
        "kind": result.kind,
        "op_id": result.op_id,
        "action": op.action,
        "target": op.target,
        "asked_before": result.asked_before,
    }
    fields = ("receipt_id", "accepted_only", "data", "code", "reason", "awaiting", "waiting_for")
    for field in fields:
        if hasattr(result, field):
            out[field] = getattr(result, field)
    review = getattr(result, "review", None)
    if review is not None:
        out["review_id"] = review.id
    message = result.message
    if result.differs:
        out["differs"] = list(result.differs)
    if result.asked_before:
        if not result.final:  # it may still happen: a repeat now could make it twice
            message += " Wait for it; never ask for it again another way."
        elif repeatable:
            again = repeat_of(purpose) + 1
            message += (
                f" Only to do it again as a separate act on purpose, call again with "
                f"`{REPEAT}` set to {again} ({again + 1} the time after that)."
            )
        else:
            message += " It happens at most once in this run."
    out["message"] = message
    return out


def refused(exc: Exception) -> dict[str, Any]:
    """A refused call as a model reads it: nothing was recorded or sent."""
    return refusal(type(exc).__name__, str(exc))


def refusal(error: str, why: str) -> dict[str, Any]:
    """A call refused for `why` (`error` names the kind of refusal)."""
    return {"kind": "refused", "error": error, "message": f"Not done, nothing was sent: {why}"}


def beat_missing_after() -> timedelta:
    """How long without a beat heartbeat counts as no beat (`OPLEDGER_BEAT_MISSING_AFTER_SECONDS`;
    the default where the settings cannot be read)."""
    from opledger.settings import SettingsInvalid, get_settings

    try:
        return timedelta(seconds=get_settings().beat_missing_after_seconds)
    except SettingsInvalid:
        return DEFAULT_MISSING_AFTER


def on_relay(result: EffectResult) -> bool:
    """Whether `result` waits on what beat's relay does: a prepared operation a worker has
    not taken (its message may be lost, or its publish failed) or left for later (its
    provider had no room): only the relay publishes it again."""
    return (
        isinstance(result, EffectPending)
        and result.operation.status is Status.PREPARED
        and result.awaiting in ("worker", "provider")  # not a person's approval, not deps
    )


def waits_for_beat(
    result: EffectResult, seen: Callable[[], BeatSeen], missing_after: timedelta
) -> EffectResult:
    """`result`, saying "it waits for beat, not seen since ..." when it waits on the relay
    (`on_relay`) and no beat ticked within `missing_after`: one read of the beat's
    heartbeat (`seen`), only for such a result. Unchanged when the heartbeat cannot be
    read."""
    if not on_relay(result):
        return result
    try:
        beat = seen()
    except LedgerError:  # an answer is never lost to this
        return result
    if not beat.missing(missing_after):
        return result
    assert isinstance(result, EffectPending)
    waiting = (
        f"{result.waiting_for}; it waits for beat, {beat.since()}: beat's relay publishes "
        "what no worker got, and none runs"
    )
    return result.model_copy(update={"waiting_for": waiting})
