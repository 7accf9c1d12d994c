"""LangGraph integration: a tool call becomes an opledger effect, keyed by the graph step.

LangGraph's checkpointer saves what the graph did; it cannot know what a provider did.
Resuming a thread after a crash re-runs the interrupted node, and replaying from an earlier
checkpoint (time travel) or forking re-runs every node after it, tool calls included. Here
each tool call is an operation whose intent is the thread and the step that asked for it:

    run  = "langgraph:<thread_id>"
    step = "<node>:<tool call id>"

so a re-run of the same tool call (same thread, node and tool call id) gets the operation
it recorded, and its outcome, back — never a second effect — while a tool call with other
arguments under the same id is refused (`IntentConflict`), and a new tool call (a fork
whose model asked for another recipient) is a new operation under its own authorization.

The tool call id is the model's: a model asked again from a checkpoint *before* it answered
may choose new ids, which are new intents. Where that must still be one effect (close this
case, whatever the model says), pass `step=` to key it by the business intent instead.

Needs the `[langgraph]` extra; nothing else in opledger imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Annotated, Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, InjectedToolCallId, StructuredTool
from pydantic import BaseModel, create_model

from opledger.ledger import InvalidInput

from .effects import EffectResult, Effects, _Result


def run_and_step(
    config: RunnableConfig | Mapping[str, Any], tool_call_id: str, *, node: str | None = None
) -> tuple[str, str]:
    """The workflow run and the step of a tool call made in a LangGraph node: the thread,
    and the node plus the tool call's id."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if not thread_id:
        raise InvalidInput(
            "a LangGraph effect needs the config's configurable.thread_id (run the graph "
            "with a checkpointer and a thread)",
            field="thread_id",
        )
    node = node or (config.get("metadata") or {}).get("langgraph_node")
    if not node:
        raise InvalidInput(
            "no LangGraph node in the config's metadata: call this inside a node, or name it "
            "(node=...)",
            field="node",
        )
    if not isinstance(tool_call_id, str) or not tool_call_id:
        raise InvalidInput("a tool call needs its id", field="tool_call_id")
    return f"langgraph:{thread_id}", f"{node}:{tool_call_id}"


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
    step: str | None = None,
) -> EffectResult:
    """Inside a node: the effect of `tool_call` (a dict with its `id`), keyed by the
    thread, the node and the tool call's id (or by `step`, when given)."""
    run, keyed = run_and_step(config, str(tool_call.get("id") or ""), node=node)
    return effects.effect(
        tenant=tenant,
        run=run,
        step=step or keyed,
        action=action,
        target=target,
        payload=payload,
        authorization_ref=authorization_ref,
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
    effect_of: Callable[[dict[str, Any]], tuple[str, dict[str, Any]]],
    wait: float | timedelta | None = 30.0,
) -> BaseTool:
    """A LangChain tool (for `ToolNode` or `bind_tools`) whose call is an opledger effect.

    `effect_of(args)` gives the target and the payload of the tool call's arguments;
    `authorization_ref` may depend on the run's config (a forked thread under its own
    grant). The tool's answer (the ToolMessage content) is the result as JSON: its kind
    (confirmed, rejected, cancelled, unknown, pending), the operation id, and the receipt,
    reason or what it waits for.
    """
    injected = create_model(
        f"{args_schema.__name__}WithToolCallId",
        __base__=args_schema,
        tool_call_id=(Annotated[str, InjectedToolCallId], ...),
    )

    def call(config: RunnableConfig, tool_call_id: str, **args: Any) -> str:
        target, payload = effect_of(args)
        ref = authorization_ref(config) if callable(authorization_ref) else authorization_ref
        result = node_effect(
            effects,
            config,
            {"id": tool_call_id},
            tenant=tenant,
            action=action,
            target=target,
            payload=payload,
            authorization_ref=ref,
            wait=wait,
        )
        return describe(result)

    return StructuredTool.from_function(
        func=call, name=name, description=description, args_schema=injected
    )


def describe(result: EffectResult) -> str:
    """The result as the JSON a model (or a ToolMessage) reads."""
    summary = result.model_dump(mode="json", include={"kind"})
    summary["op_id"] = result.op_id
    for field in ("receipt_id", "accepted_only", "code", "reason", "waiting_for"):
        if hasattr(result, field):
            summary[field] = getattr(result, field)
    review = getattr(result, "review", None)
    if review is not None:
        summary["review_id"] = review.id
    return json.dumps(summary, sort_keys=True)
