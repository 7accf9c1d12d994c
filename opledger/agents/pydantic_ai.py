"""Pydantic AI integration: a tool call becomes an opledger effect, keyed by the business act.

A Pydantic AI agent asked again — a run started again after a crash, a retry, a re-run of
a conversation — asks its model again, and the model gives its tool calls new ids (every
chat model API does) and may reword its arguments; an approved tool runs again on an
ordinary retry. So the tool-call id is never the intent. Each effect's intent is:

    run    = a run that survives a restart (below)
    intent = the action, the target, the action's intent fields, and `purpose`

(`opledger.ledger.intents`), so the same act asked again — re-asked under new ids,
reworded, re-run after a kill — gets the operation it recorded and its outcome back as
the tool's answer, never a second effect. An action whose act is the tenant's (its intent
scope: a refund of one charge, closing one case) leaves the run out: any run of the tenant
asking it is answered with the operation the first one recorded (`first_asked_in`). The
tool-call id is kept as evidence of which call asked (`asked_by`: `<tool>:<tool_call_id>`,
`Ledger.asks`). The model asks for a deliberately repeated act (a second reminder) with the
tool's `repeat` argument (2 for the second time).

**The run.** `RunContext.run_id` is not one: it is a fresh UUID7 on every `agent.run`
unless the caller names it, and a run started again after a crash gets a new one (so does
a DBOS workflow recovered under the deprecated `DBOSAgent`); `RunContext.conversation_id`
is a fresh UUID7 too unless it is passed or inherited from a stored message history. The
run of an effect is, in this order:

1. `run(ctx)`, a function of yours (`effect_tool(..., run=...)`): a run you name, such as
   the ticket the agent works on (`lambda ctx: f"support:{ctx.deps.ticket}"`), or
   `conversation_run` where you pass `conversation_id=` yourself;
2. inside a DBOS workflow (`DBOSDurability`, or the deprecated `DBOSAgent`):
   `dbos:<workflow id>` — DBOS recovers a workflow under its id, replays its recorded model
   steps and runs its tools again;
3. inside a Temporal workflow or activity (`TemporalDurability`, `TemporalAgent`: tools run
   as activities): `temporal:<workflow id>` — kept by retries, resets and continue-as-new,
   unlike Temporal's run id;
4. else none (Prefect's durability is not detected; a Temporal activity no workflow
   started has no workflow id): the tool raises `UnnamedRun` rather than key an effect by
   an id that the next run will not have.

A refusal the call itself caused (a revoked or missing grant, an argument the ledger
refuses) is answered to the model as a failed tool result (`ToolFailed`: it reads
`kind: "refused"` and the run goes on, no retry budget spent); what no call can fix (no
run, the database down, an action no adapter serves, intent fields nobody declared, a
payload the tool built that the ledger cannot record: `opledger.agents.tooling`) is
raised and ends the run.

Needs the `[pydantic-ai]` extra; nothing else in opledger imports this module.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NoReturn

from pydantic import BaseModel
from pydantic_ai import RunContext, Tool
from pydantic_ai.exceptions import ToolFailed

from .answers import UnnamedRun, refused
from .effects import Effects
from .results import _Result
from .tooling import EffectCall, EffectOf, aanswer, arguments_of, asker, tool_intent

__all__ = [
    "RunOf",
    "UnnamedRun",
    "asker_of",
    "conversation_run",
    "durable_run",
    "effect_tool",
    "run_of",
    "tool_effect",
]

#: the run of a tool call, from its context
RunOf = Callable[[RunContext[Any]], str]
#: `Tool`'s own arguments `effect_tool` sets itself (the function and its schema are ours)
_OURS = frozenset({"self", "function", "takes_ctx", "name", "description", "function_schema"})


def durable_run() -> str | None:
    """The run of the durable workflow this code runs in, if any: `dbos:<workflow id>` in
    a DBOS workflow, `temporal:<workflow id>` in a Temporal workflow or activity. None
    elsewhere (a standalone Temporal activity, started by no workflow, has none). Neither
    engine is imported here: code runs in one only once it is."""
    dbos = sys.modules.get("dbos")
    if dbos is not None:
        workflow_id = dbos.DBOS.workflow_id
        if workflow_id:
            return f"dbos:{workflow_id}"
    activity = sys.modules.get("temporalio.activity")
    if activity is not None and activity.in_activity():
        workflow_id = activity.info().workflow_id
        return f"temporal:{workflow_id}" if workflow_id else None
    workflow = sys.modules.get("temporalio.workflow")
    if workflow is not None and workflow.in_workflow():
        workflow_id = workflow.info().workflow_id
        return f"temporal:{workflow_id}" if workflow_id else None
    return None


def run_of(ctx: RunContext[Any]) -> str:
    """The default run of a tool call: the durable workflow's (`durable_run`), else
    `UnnamedRun` is raised."""
    run = durable_run()
    if run is None:
        raise UnnamedRun(
            "a Pydantic AI effect needs a run that survives a restart, and this call has "
            f"none: it runs in no DBOS or Temporal workflow, and its run id {ctx.run_id!r} is "
            "new on every agent run. Name the run: effect_tool(..., run=lambda ctx: ...) "
            "(from your deps, say), or conversation_run if you pass conversation_id= yourself"
        )
    return run


def conversation_run(ctx: RunContext[Any]) -> str:
    """The run as the conversation (`pydantic-ai:conversation:<conversation_id>`), for
    `run=`: only where you pass `conversation_id=` to the agent's runs yourself (or always
    continue from the conversation's stored message history): a conversation id Pydantic
    AI made up for a run whose history was lost is another one when it runs again."""
    if not ctx.conversation_id:
        raise UnnamedRun("conversation_run needs the run's conversation_id")
    return f"pydantic-ai:conversation:{ctx.conversation_id}"


def asker_of(ctx: RunContext[Any]) -> str | None:
    """Who asked, for the record: `<tool>:<tool_call_id>`. Evidence only: it never decides
    the intent."""
    return asker(ctx.tool_name, ctx.tool_call_id)


async def tool_effect(
    ctx: RunContext[Any],
    effects: Effects,
    *,
    tenant: str,
    action: str,
    target: str,
    payload: dict[str, Any],
    authorization_ref: str,
    repeat: int | None = None,
    after: Sequence[str | _Result] = (),
    wait: float | timedelta | None = 30.0,
    intent_fields: Sequence[str] | None = None,
    intent_key: str | None = None,
    run: RunOf | None = None,
    repeatable: bool = True,
) -> dict[str, Any]:
    """Inside a tool function of your own (`@agent.tool`): the effect this call asks for,
    keyed by the act (see the module's docstring), as the answer the model reads
    (`answers.summary`). `repeat` is the model's deliberate repeat (2 for the second time).
    A refusal is raised as `ToolFailed` (the model reads it; the run goes on); a payload
    the ledger cannot record (not JSON, too deep, too large) is raised as it is: your
    code built it, no call can fix it."""
    intent = tool_intent(
        tenant=tenant,
        run=(run or run_of)(ctx),
        action=action,
        target=target,
        payload=payload,
        authorization_ref=authorization_ref,
        repeat=repeat,
        after=after,
        intent_fields=intent_fields,
        intent_key=intent_key,
        asked_by=asker_of(ctx),
    )
    return await aanswer(effects, intent, wait=wait, repeatable=repeatable, refuse=_failed)


def _failed(exc: Exception) -> NoReturn:
    """A refusal as a failed tool result the model reads (no retry budget spent)."""
    raise ToolFailed(json.dumps(refused(exc), sort_keys=True)) from exc


def effect_tool(
    effects: Effects,
    *,
    name: str,
    description: str,
    args_schema: type[BaseModel],
    tenant: str,
    action: str,
    authorization_ref: str | Callable[[RunContext[Any]], str],
    effect_of: EffectOf,
    wait: float | timedelta | None = 30.0,
    intent_fields: Sequence[str] | None = None,
    repeatable: bool = True,
    run: RunOf | None = None,
    **tool_options: Any,
) -> Tool[Any]:
    """A Pydantic AI `Tool` (for `Agent(tools=[...])` or a `FunctionToolset`) whose call is
    an opledger effect, keyed by the act it asks for, never by its tool-call id; it waits
    with `Effects.aask` (the event loop is never blocked).

    The model sees `args_schema`'s fields as the tool's arguments (validated by Pydantic
    AI: invalid ones get its usual retry prompt); `effect_of(args)` gives the target and the
    payload of the validated arguments as JSON-ready values (a dict,
    `model_dump(mode="json")`: a date as ISO text, a Decimal as text); the action's intent
    fields (`intent_fields`, else what its adapter declares) are payload fields.
    `authorization_ref` may depend on the call's context (`ctx.deps`); `run(ctx)` names the
    run (default `run_of`: the DBOS or Temporal workflow, else `UnnamedRun`). With
    `repeatable` (the default) the tool takes an optional integer `repeat` argument the
    model sets only to ask for the same act again on purpose (2 for the second time);
    without it, the act happens at most once per run (per tenant, for an action of the
    tenant's scope). An `args_schema` with a `repeat` field of its own needs
    `repeatable=False` (raises `ValueError`). `tool_options` are `Tool`'s own
    (`requires_approval`, `strict`, `max_retries`, `sequential`, `timeout`, `metadata`,
    ...); a name `Tool` does not take, or one this function sets, raises `TypeError`.

    The tool's return (what the model reads) is the result as a dict (`answers.summary`):
    its kind (confirmed, rejected, cancelled, unknown, pending), the operation, the
    receipt and the provider's data, or the reason or what it waits for, `asked_before`,
    `differs`, and a `message` in words. A refusal the call caused is a failed tool result
    (`ToolFailed`, JSON with `kind: "refused"`); what no call can fix is raised, a payload
    `effect_of` built that the ledger cannot record among it.
    """
    _check_options(tool_options)
    arguments = arguments_of(args_schema, repeatable=repeatable)
    call: EffectCall[RunContext[Any]] = EffectCall(
        effects,
        tenant=tenant,
        action=action,
        authorization_ref=authorization_ref,
        effect_of=effect_of,
        wait=wait,
        intent_fields=intent_fields,
        repeatable=repeatable,
        run=run or run_of,
        asked_by=asker_of,
    )

    async def function(ctx: RunContext[Any], args: BaseModel) -> dict[str, Any]:
        return await call.aanswer(ctx, args, _failed)

    # one argument of a model type: Pydantic AI takes the model's fields as the arguments
    function.__annotations__ = {"ctx": RunContext[Any], "args": arguments, "return": dict[str, Any]}
    return Tool(function, takes_ctx=True, name=name, description=description, **tool_options)


def _check_options(options: dict[str, Any]) -> None:
    """Raise `TypeError` for an option `Tool` does not take, or one `effect_tool` sets."""
    takes = set(inspect.signature(Tool.__init__).parameters) - _OURS
    wrong = sorted(set(options) - takes)
    if wrong:
        raise TypeError(
            f"effect_tool() got Tool options it cannot pass: {', '.join(wrong)} (Tool's own "
            f"it passes: {', '.join(sorted(takes))})"
        )
