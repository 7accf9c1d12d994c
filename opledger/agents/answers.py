"""What an agent reads back from an effect, whichever way it called (a LangGraph tool, an
MCP tool): how the act stands, a refusal, and the `repeat` argument that asks for a
deliberately repeated act. One wording for every agent surface."""

from __future__ import annotations

from typing import Any

from opledger.ledger import (
    AuthorizationError,
    IntentFieldsUndeclared,
    InvalidInput,
    UnknownAction,
)

from .results import EffectResult

#: the argument a model sets to ask for a deliberately repeated act: a number, which a
#: model asked again (a replay, a fork) repeats far more faithfully than any wording it
#: would give the reason
REPEAT = "repeat"
REPEAT_HELP = (
    "Leave this out. Only to do again, on purpose, an act this conversation already did "
    "(the tool said so): 2 for the second time, 3 for the third. Never set it to retry, "
    "to correct a call or to get an answer sooner."
)

#: what the ledger refuses because of what a call asked: answered to the model ...
REFUSED = (AuthorizationError, InvalidInput)
#: ... except what no call can fix: an action no adapter serves, undeclared intent fields
UNFIXABLE = (UnknownAction, IntentFieldsUndeclared)


def purpose_of(repeat: int | None) -> str | None:
    """The intent's purpose for a `repeat` argument (none for the first time)."""
    return f"repeat {repeat}" if repeat is not None and repeat > 1 else None


def summary(result: EffectResult, *, repeatable: bool = True) -> dict[str, Any]:
    """The result as a model reads it: what it is, how it stands, and a `message` in words."""
    op = result.operation
    out: dict[str, Any] = {
        "kind": result.kind,
        "op_id": result.op_id,
        "action": op.action,
        "target": op.target,
        "asked_before": result.asked_before,
    }
    for field in ("receipt_id", "accepted_only", "data", "code", "reason", "waiting_for"):
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
            message += (
                f" Only to do it again as a separate act on purpose, call again with "
                f"`{REPEAT}` set to 2 (3 for a third time)."
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
