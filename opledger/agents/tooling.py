"""What every agent framework's effect tool does, whichever framework calls it (LangGraph,
Pydantic AI, the OpenAI Agents SDK): the tool's arguments with the `repeat` a model sets for
a deliberate repeat, the intent of one call, and the answer the model reads — or what is
raised instead. Imports no agent framework: each integration hands it its context and how
to read the run, the asker and a refusal from it.

The arguments `effect_of` receives are the validated arguments as JSON-ready values
(`model_dump(mode="json")`: a date as its ISO text, a `Decimal` or a UUID as text, an enum
as its value, a nested model as a dict), so the payload it builds from them is one the
ledger can record. A payload it builds that the ledger still cannot record
(`UNRECORDABLE`: not JSON, too deep, too large) is the tool's, not the call's: the model
gave arguments the tool's schema accepted, and no other call can fix it, so it is raised
(and ends the agent's run), never answered as a refusal the model would ask again after.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, Field, create_model

from opledger.ledger import PayloadNotCanonicalizable, PayloadTooDeep, PayloadTooLarge
from opledger.ledger.ids import evidence_text
from opledger.ledger.intents import Intent

from . import answers
from .answers import REFUSED, REPEAT, REPEAT_HELP, purpose_of, summary
from .effects import Effects
from .results import EffectResult, _Result

__all__ = [
    "UNFIXABLE",
    "UNRECORDABLE",
    "EffectCall",
    "EffectOf",
    "aanswer",
    "answer",
    "arguments_of",
    "asker",
    "tool_intent",
]

Ctx = TypeVar("Ctx")
#: the target and the payload of a call's arguments (JSON-ready values)
EffectOf = Callable[[dict[str, Any]], tuple[str, dict[str, Any]]]
#: what a payload the tool built cannot be recorded as: the tool's defect, raised
UNRECORDABLE = (PayloadNotCanonicalizable, PayloadTooDeep, PayloadTooLarge)
#: what an effect tool raises rather than answers: what no call can fix
UNFIXABLE = (*answers.UNFIXABLE, *UNRECORDABLE)
#: what the model read for a refusal (or raised as the framework's failed tool result)
Refuse = Callable[[Exception], dict[str, Any]]

_UNRECORDABLE_NOTE = (
    "raised, not answered to the model: the tool built this payload from arguments its "
    "schema accepted, so no call can fix it. Build the payload of JSON values, and bound "
    "the arguments in the tool's schema (max_length, ge/le): the model is told what its "
    "schema refuses, and can fix that"
)


def arguments_of(args_schema: type[BaseModel], *, repeatable: bool) -> type[BaseModel]:
    """The tool's arguments: `args_schema`, with the optional `repeat` a repeatable tool
    adds (`answers.REPEAT_HELP`). A repeatable tool whose schema has a `repeat` of its own
    raises `ValueError`."""
    if not repeatable:
        return args_schema
    if REPEAT in args_schema.model_fields:
        raise ValueError(
            f"{args_schema.__name__} has a field named {REPEAT!r}, the argument a repeatable "
            "tool adds for deliberate repeats: rename it, or pass repeatable=False"
        )
    repeat: Any = (int | None, Field(default=None, ge=1, le=1000, description=REPEAT_HELP))
    return create_model(args_schema.__name__, __base__=args_schema, **{REPEAT: repeat})


def asker(tool: str | None, call_id: object) -> str | None:
    """Who asked, for the record: `<tool>:<call id>`, the tool alone for a call without
    an id. Evidence only: it never decides the intent."""
    if not isinstance(call_id, str) or not call_id.strip():
        return evidence_text(tool)
    return evidence_text(f"{tool}:{call_id}" if tool else call_id)


def tool_intent(
    *,
    tenant: str,
    run: str,
    action: str,
    target: str,
    payload: dict[str, Any],
    authorization_ref: str,
    repeat: int | None = None,
    after: Sequence[str | _Result] = (),
    intent_fields: Sequence[str] | None = None,
    intent_key: str | None = None,
    asked_by: str | None = None,
) -> Intent:
    """The intent a tool function of the user's own asks for (`tool_effect`)."""
    return Intent(
        tenant=tenant,
        workflow_id=run,
        action=action,
        target=target,
        payload=payload,
        authorization_ref=authorization_ref,
        purpose=purpose_of(repeat),
        intent_fields=intent_fields,
        intent_key=intent_key,
        asked_by=asked_by,
        after=tuple(a.op_id if isinstance(a, _Result) else a for a in after),
    )


def answer(
    effects: Effects,
    intent: Intent,
    *,
    wait: float | timedelta | None,
    repeatable: bool,
    refuse: Refuse,
) -> dict[str, Any]:
    """How the act stands, as the model reads it (`answers.summary`, naming the next
    repeat after the one asked); a refusal as `refuse(exc)` gives it; what no call can fix
    (`UNFIXABLE`) raised."""
    try:
        result = effects.ask(intent, wait=wait)
    except UNFIXABLE as exc:
        _noted(exc)
        raise
    except REFUSED as exc:
        return refuse(exc)
    return _read(result, intent, repeatable)


async def aanswer(
    effects: Effects,
    intent: Intent,
    *,
    wait: float | timedelta | None,
    repeatable: bool,
    refuse: Refuse,
) -> dict[str, Any]:
    """`answer` for asyncio (`Effects.aask`: the wait never blocks the event loop)."""
    try:
        result = await effects.aask(intent, wait=wait)
    except UNFIXABLE as exc:
        _noted(exc)
        raise
    except REFUSED as exc:
        return refuse(exc)
    return _read(result, intent, repeatable)


def _read(result: EffectResult, intent: Intent, repeatable: bool) -> dict[str, Any]:
    return summary(result, repeatable=repeatable, purpose=intent.purpose)


def _noted(exc: Exception) -> None:
    """A payload the tool built that cannot be recorded says why it is raised."""
    if isinstance(exc, UNRECORDABLE) and _UNRECORDABLE_NOTE not in getattr(exc, "__notes__", ()):
        exc.add_note(_UNRECORDABLE_NOTE)


@dataclass(frozen=True)
class EffectCall(Generic[Ctx]):
    """What an `effect_tool` call does, whichever framework calls it with its context
    (`Ctx`): `run(ctx)` names the run, `asked_by(ctx)` who asked, `authorization_ref` is
    the grant's ref or a function of the context."""

    effects: Effects
    tenant: str
    action: str
    authorization_ref: str | Callable[[Ctx], str]
    effect_of: EffectOf
    wait: float | timedelta | None
    intent_fields: Sequence[str] | None
    repeatable: bool
    run: Callable[[Ctx], str]
    asked_by: Callable[[Ctx], str | None]

    def intent(self, ctx: Ctx, args: BaseModel) -> Intent:
        """The intent of one call: `effect_of` given the validated arguments as JSON-ready
        values, `repeat` taken out first (a call with no run is misconfigured, not the
        call's fault: raised)."""
        values = args.model_dump(mode="json")
        repeat = values.pop(REPEAT, None) if self.repeatable else None
        the_run, asked_by = self.run(ctx), self.asked_by(ctx)
        target, payload = self.effect_of(values)
        ref = self.authorization_ref
        return Intent(
            tenant=self.tenant,
            workflow_id=the_run,
            action=self.action,
            target=target,
            payload=payload,
            authorization_ref=ref(ctx) if callable(ref) else ref,
            purpose=purpose_of(repeat),
            intent_fields=self.intent_fields,
            asked_by=asked_by,
        )

    def answer(self, ctx: Ctx, args: BaseModel, refuse: Refuse) -> dict[str, Any]:
        """The call's answer (`answer`), waiting in this thread."""
        intent = self.intent(ctx, args)
        return answer(
            self.effects, intent, wait=self.wait, repeatable=self.repeatable, refuse=refuse
        )

    async def aanswer(self, ctx: Ctx, args: BaseModel, refuse: Refuse) -> dict[str, Any]:
        """The call's answer (`aanswer`), waiting without blocking the event loop."""
        intent = self.intent(ctx, args)
        return await aanswer(
            self.effects, intent, wait=self.wait, repeatable=self.repeatable, refuse=refuse
        )
