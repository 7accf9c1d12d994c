"""LangGraph integration: a tool call becomes an opledger effect, keyed by the business act.

LangGraph's checkpointer saves what the graph did; it cannot know what a provider did.
Resuming a thread after a crash re-runs the interrupted node; replaying from an earlier
checkpoint (time travel) or forking re-runs every node after it, and a node that calls
the model asks it again — and a model asked again gives its tool calls new ids (every
real chat model API does) and may reword its arguments. So the tool call id is never the
intent. Each effect's intent is:

    run    = "langgraph:<thread_id>"                (or your own `run_of(config)`)
    intent = the action, the target, the action's intent fields, and `purpose`

(`opledger.ledger.intents`), so the same act asked again in the thread — resumed,
replayed, forked, re-asked under new ids, reworded — gets the operation it recorded and
its outcome back as the tool's answer, never a second effect. An action whose act is the
tenant's (its intent scope: a refund of one charge, closing one case) leaves the run out:
another thread, a restarted agent under a new thread id, a fork into a thread of its own
asking the same act get the operation the first one recorded (`first_asked_in` names that
run), under their own grant, checked first. The tool call id and the
node are kept as evidence of which call asked (`Ledger.asks`). A changed business intent
(a fork that emails another recipient) is a new act: a new operation, under the grant the
tool names at that moment. The model asks for a deliberately repeated act (a second
reminder) with the tool's `repeat` argument (2 for the second time).

Needs the `[langgraph]` extra; nothing else in opledger imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Annotated, Any, NoReturn

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool, ToolException
from langgraph.types import interrupt
from pydantic import BaseModel, create_model

from opledger.ledger import (
    InvalidInput,
)

from .answers import refused, summary
from .effects import Effects
from .results import EffectResult, _Result
from .tooling import EffectCall, EffectOf, arguments_of, asker

#: what a LangGraph tool call is asked in: the run's config and the tool call's id
_Call = tuple[RunnableConfig, str]


def run_of(config: RunnableConfig | Mapping[str, Any]) -> str:
    """The workflow run of a LangGraph call: its thread (`langgraph:<thread_id>`)."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise InvalidInput(
            "a LangGraph effect needs the config's configurable.thread_id (run the graph "
            "with a checkpointer and a thread)",
            field="thread_id",
        )
    return f"langgraph:{thread_id}"


def asker_of(
    config: RunnableConfig | Mapping[str, Any], tool_call_id: str, *, node: str | None = None
) -> str:
    """Who asked, for the record: the node (when the config names one) and the tool call's
    id, `<node>:<id>`. Evidence only: it never decides the intent."""
    if not isinstance(tool_call_id, str) or not tool_call_id.strip():
        raise InvalidInput("a tool call needs its id", field="tool_call_id")
    node = node or (config.get("metadata") or {}).get("langgraph_node")
    asked_by = asker(node, tool_call_id)
    assert asked_by is not None  # the id is not blank
    return asked_by


def node_effect(
    effects: Effects,
    config: RunnableConfig | Mapping[str, Any],
    tool_call: Mapping[str, Any],
    *,
    tenant: str,
    action: str,
    target: str,
    payload: dict[str, Any],
    authorization_ref: str,
    after: Sequence[str | _Result] = (),
    wait: float | timedelta | None = None,
    node: str | None = None,
    purpose: str | None = None,
    intent_fields: Sequence[str] | None = None,
    intent_key: str | None = None,
    run: str | None = None,
) -> EffectResult:
    """Inside a node: the effect `tool_call` (a dict with its `id`) asks for, in the
    thread's run, keyed by the act (see the module's docstring; `intent_key` names the intent
    yourself, `run` another run than the thread). The tool call's id is kept as who asked."""
    return effects.effect(
        tenant=tenant,
        run=run or run_of(config),
        action=action,
        target=target,
        payload=payload,
        authorization_ref=authorization_ref,
        purpose=purpose,
        intent_fields=intent_fields,
        intent_key=intent_key,
        asked_by=asker_of(config, str(tool_call.get("id") or ""), node=node),
        after=after,
        wait=wait,
    )


def effect_tool(
    effects: Effects,
    *,
    name: str,
    description: str,
    args_schema: type[BaseModel],
    tenant: str,
    action: str,
    authorization_ref: str | Callable[[RunnableConfig], str],
    effect_of: EffectOf,
    wait: float | timedelta | None = 30.0,
    intent_fields: Sequence[str] | None = None,
    repeatable: bool = True,
    run: Callable[[RunnableConfig], str] = run_of,
    pause_for_approval: bool = False,
) -> BaseTool:
    """A LangChain tool (for `ToolNode`, `create_react_agent`, `bind_tools`) whose call is
    an opledger effect, keyed by the act it asks for, never by its tool call id. It runs
    with `invoke` (in `ToolNode`'s threads) and natively with `ainvoke` (`Effects.aask`: the
    wait never holds a thread).

    `effect_of(args)` gives the target and the payload of the tool call's validated
    arguments as JSON-ready values (a dict, `model_dump(mode="json")`: a date as ISO text,
    a Decimal as text, a nested model as a dict); the action's intent fields
    (`intent_fields`, else what its adapter declares) are payload fields.
    `authorization_ref` may depend on the run's config (a forked thread under its own
    grant); `run(config)` names the workflow run (the thread by default). With
    `repeatable` (the default) the tool takes an optional integer `repeat` argument the
    model sets only to ask for the same act again on purpose (2 for the second time);
    without it, the act happens at most once per run (per tenant, for an action of the
    tenant's scope). An `args_schema` with a `repeat`
    field of its own needs `repeatable=False` (raises `ValueError`).

    The tool's answer (the ToolMessage content) is the result as JSON (`describe`): its
    kind (confirmed, rejected, cancelled, unknown, pending), the operation, the receipt and
    the provider's result data, or the reason or what it waits for, and a `message` in
    words. An act this run already asked for is answered with its recorded outcome
    (`asked_before`, and `differs` naming what the new call changed, which was not sent).
    A refusal the call itself caused (a revoked or missing grant, an argument the ledger
    refuses) is answered as an error ToolMessage the model reads (`kind: "refused"`); what
    no call can fix (no thread, the database down, an action no adapter serves, intent
    fields nobody declared, a payload `effect_of` built that the ledger cannot record) is
    raised.

    An act its action's approval policy holds for a person is answered at once (`pending`,
    `awaiting: "approval"`). With `pause_for_approval`, the tool pauses the graph instead
    (LangGraph's `interrupt`, with that answer as the interrupt's value; the graph needs a
    checkpointer): resumed (`Command(resume=...)`, whatever the value) once a person
    decided, the call asks again — the same act, the same operation, never a second
    approval request — and pauses again while the approval is still pending.
    """
    arguments = arguments_of(args_schema, repeatable=repeatable)
    extra: dict[str, Any] = {"tool_call_id": (Annotated[str, InjectedToolCallId], ...)}
    injected = create_model(f"{args_schema.__name__}WithToolCallId", __base__=arguments, **extra)
    ref = authorization_ref
    tool = _EffectTool(
        EffectCall(
            effects,
            tenant=tenant,
            action=action,
            authorization_ref=ref if isinstance(ref, str) else lambda call: ref(call[0]),
            effect_of=effect_of,
            wait=wait,
            intent_fields=intent_fields,
            repeatable=repeatable,
            run=lambda call: run(call[0]),
            asked_by=lambda call: asker_of(*call),
        ),
        arguments,
        pause_for_approval,
    )
    return StructuredTool.from_function(
        func=tool.call,
        coroutine=tool.acall,
        name=name,
        description=description,
        args_schema=injected,
        handle_tool_error=True,  # a ToolException is the answer, with status "error"
    )


class _EffectTool:
    """What an `effect_tool` call does, in its synchronous and its asyncio form: the
    arguments LangChain validated (as values, not a model) taken as the model again."""

    def __init__(
        self, call: EffectCall[_Call], arguments: type[BaseModel], pause: bool = False
    ) -> None:
        self._call = call
        self._arguments = arguments
        self._pause = pause

    def call(self, config: RunnableConfig, tool_call_id: str, **args: Any) -> str:
        answer = self._call.answer((config, tool_call_id), self._args(args), _refuse)
        while self._pause and _held(answer):
            # the first pass raises (the graph pauses); resumed, it returns, and the call
            # asks again: the same operation, approved now or still held (paused again)
            interrupt(answer)
            answer = self._call.answer((config, tool_call_id), self._args(args), _refuse)
        return json.dumps(answer, sort_keys=True, default=str)

    async def acall(self, config: RunnableConfig, tool_call_id: str, **args: Any) -> str:
        answer = await self._call.aanswer((config, tool_call_id), self._args(args), _refuse)
        while self._pause and _held(answer):
            interrupt(answer)
            answer = await self._call.aanswer((config, tool_call_id), self._args(args), _refuse)
        return json.dumps(answer, sort_keys=True, default=str)

    def _args(self, args: dict[str, Any]) -> BaseModel:
        """The validated arguments LangChain hands over (each field's value) as the model
        they were validated as, for `model_dump(mode="json")`."""
        return self._arguments.model_construct(**args)


def _held(answer: dict[str, Any]) -> bool:
    """Whether the answer is of an act held for a person's approval."""
    return answer.get("kind") == "pending" and answer.get("awaiting") == "approval"


def _refuse(exc: Exception) -> NoReturn:
    """A refusal as an error ToolMessage the model reads."""
    raise ToolException(refusal(exc)) from exc


def refusal(exc: Exception) -> str:
    """A refused call as the JSON a model reads: nothing was recorded or sent."""
    return json.dumps(refused(exc), sort_keys=True)


def describe(result: EffectResult, *, repeatable: bool = True) -> str:
    """The result as the JSON a model (or a ToolMessage) reads: what it is, how it stands,
    and a `message` in words (`answers.summary`)."""
    return json.dumps(summary(result, repeatable=repeatable), sort_keys=True, default=str)
