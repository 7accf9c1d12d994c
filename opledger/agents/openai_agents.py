"""OpenAI Agents SDK integration: a tool call becomes an opledger effect, keyed by the act.

An Agents SDK run asked again — a process killed mid-tool and run again with its session,
a retry, a run resumed from a `RunState` after an approval — asks its model again, and the
model gives its tool calls new ids (every chat model API does) and may reword their
arguments; an approved tool runs again on an ordinary retry. So the tool-call id is never
the intent. Each effect's intent is:

    run    = the conversation the SDK runs (below)
    intent = the action, the target, the action's intent fields, and `purpose`

(`opledger.ledger.intents`), so the same act asked again — re-asked under new ids,
reworded, run again after a kill, approved and resumed twice — gets the operation it
recorded and its outcome back as the tool's answer, never a second effect. An action whose
act is the tenant's (its intent scope: a refund of one charge, closing one case) leaves the
run out: any run of the tenant asking it is answered with the operation the first one
recorded (`first_asked_in`). The tool-call id is kept as evidence of which call asked
(`asked_by`: `<tool>:<call_id>`, `Ledger.asks`). The model asks for a deliberately repeated
act (a second reminder) with the tool's `repeat` argument (2 for the second time).

**The run** is the SDK's own identity of a conversation, in the SDK's own order (the one
it groups a run's prompt cache by): the server-managed conversation (`conversation_id`),
else the session (`session.session_id`: `SQLiteSession`, `SQLAlchemySession`,
`OpenAIConversationsSession`, any `Session`), else the run config's `group_id` — never the
per-run value the SDK makes up when there is none of them, and never a tool-call id. The SDK
hands a tool neither the session nor the conversation id (a `ToolContext` carries the
call's id, the run's context and its `RunConfig`), so the run is taken, in this order, from:

1. `run(ctx)`, a function of yours (`effect_tool(..., run=...)`): a run you name, such as
   the ticket in your context (`lambda ctx: f"support:{ctx.context.ticket}"`);
2. the conversation bound by `run_agent(agent, input, session=...)` (or a `bind_run(...)`
   block around `Runner.run`, `run_sync` or `run_streamed`):
   `openai-agents:conversation:<id>`, else `openai-agents:session:<session_id>`, else
   `openai-agents:group:<group_id>` — read when the tool runs, so an
   `OpenAIConversationsSession` that creates its conversation on first use has one; a run
   resumed from a `RunState` binds what the SDK resumes it with (the conversation given,
   else the state's; the run config's group, else the state's trace group);
3. the `group_id` of the run's `RunConfig` (`openai-agents:group:<group_id>`), which the SDK
   hands every tool: `Runner.run(..., run_config=RunConfig(group_id=thread_id))`;
4. else none: the tool raises `UnnamedRun`, and the run ends, rather than key an effect by
   an id the next run will not have.

A session survives a restart only under an id the next process has: `SQLiteSession` with a
file (not in memory), `SQLAlchemySession`, `OpenAIConversationsSession(conversation_id=...)`.
A group id is the SDK's trace grouping ("a chat thread ID"): give it per conversation, never
per process or per deployment, or every conversation in it is one run.

A refusal the call itself caused (a revoked or missing grant, an argument the ledger or the
tool's schema refuses) is the tool's output, which the model reads (`kind: "refused"`), and
the run goes on; what no call can fix (no run, the database down, an action no adapter
serves, intent fields nobody declared, a payload the tool built that the ledger cannot
record) is raised and ends the run (`Runner.run` raises the
SDK's `UserError`, the error as its `__cause__`). The tools have no failure formatter
(`failure_error_function`): the SDK's default would answer a cancelled call "An error
occurred while running the tool. Please try again." and go on.

Needs the `[openai-agents]` extra; nothing else in opledger imports this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from agents import Agent, FunctionTool, RunConfig, Runner, RunResult, RunState, Session
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext
from pydantic import BaseModel, ValidationError

from .answers import UnnamedRun, refusal, refused
from .effects import Effects
from .results import _Result
from .tooling import EffectCall, EffectOf, aanswer, arguments_of, asker, tool_intent

__all__ = [
    "PREFIX",
    "Conversation",
    "RunOf",
    "UnnamedRun",
    "asker_of",
    "bind_run",
    "effect_tool",
    "run_agent",
    "run_of",
    "tool_effect",
]

#: the run of a tool call, from its context
RunOf = Callable[[ToolContext[Any]], str]
#: what every run this module names starts with
PREFIX = "openai-agents"


@dataclass(frozen=True)
class Conversation:
    """The conversation a run of the SDK carries on: what `bind_run` binds."""

    conversation_id: str | None = None
    session: Session | None = None
    group_id: str | None = None

    def run(self) -> str | None:
        """Its run, in the SDK's own order: the conversation, the session, the group."""
        conversation_id = _name(self.conversation_id)
        if conversation_id is not None:
            return f"{PREFIX}:conversation:{conversation_id}"
        session_id = _session_id(self.session)
        if session_id is not None:
            return f"{PREFIX}:session:{session_id}"
        group_id = _name(self.group_id)
        return f"{PREFIX}:group:{group_id}" if group_id is not None else None


_bound: ContextVar[Conversation | None] = ContextVar("opledger_openai_agents_run", default=None)


@contextmanager
def bind_run(
    *,
    session: Session | None = None,
    conversation_id: str | None = None,
    group_id: str | None = None,
) -> Iterator[Conversation]:
    """Within the block, effect tools key their acts by this conversation (see the module's
    docstring): pass what you pass to `Runner.run`, `run_sync` or `run_streamed`. The
    binding is a context variable: the runner's tasks started in the block inherit it."""
    conversation = Conversation(conversation_id=conversation_id, session=session, group_id=group_id)
    token = _bound.set(conversation)
    try:
        yield conversation
    finally:
        _bound.reset(token)


async def run_agent(
    agent: Agent[Any],
    input: str | list[Any] | RunState[Any],
    *,
    session: Session | None = None,
    conversation_id: str | None = None,
    run_config: RunConfig | None = None,
    **kwargs: Any,
) -> RunResult:
    """`Runner.run(agent, input, ...)` with its conversation bound for the effect tools
    (`bind_run`): `input` is the user's input, or a `RunState` to resume; every other
    argument is `Runner.run`'s. A resumed run binds what the SDK resumes it with: the
    conversation given, else the state's, and the run config's group, else the state's
    trace group."""
    bound_conversation, group_id = conversation_id, None
    if run_config is not None:
        group_id = run_config.group_id
    if isinstance(input, RunState):
        bound_conversation, group_id = _resumed(input, conversation_id, run_config, kwargs)
    with bind_run(session=session, conversation_id=bound_conversation, group_id=group_id):
        return await Runner.run(
            agent,
            input,
            session=session,
            conversation_id=conversation_id,
            run_config=run_config,
            **kwargs,
        )


def _resumed(
    state: RunState[Any],
    conversation_id: str | None,
    run_config: RunConfig | None,
    kwargs: dict[str, Any],
) -> tuple[str | None, str | None]:
    """The conversation id and the group a run resumed from `state` runs under, as the SDK
    resolves them (its own functions, with the arguments `Runner.run` passes them): the
    conversation given, else the one the state saved; the run config's group, else the
    state's trace group."""
    try:
        from agents.run_internal.agent_runner_helpers import (
            apply_resumed_conversation_settings,
            resolve_trace_settings,
        )
    except ImportError:  # an SDK that moved them: what they resolve, read as they read it
        trace = getattr(state, "_trace_state", None)
        group = run_config.group_id if run_config is not None else None
        return (
            conversation_id or getattr(state, "_conversation_id", None),
            group or getattr(trace, "group_id", None),
        )
    # what Runner.run applies to the state first thing on resume, with the same arguments
    conversation, _, _ = apply_resumed_conversation_settings(
        run_state=state,
        conversation_id=conversation_id,
        previous_response_id=kwargs.get("previous_response_id"),
        auto_previous_response_id=kwargs.get("auto_previous_response_id", False),
    )
    _, _, group, _, _ = resolve_trace_settings(
        run_state=state, run_config=run_config if run_config is not None else RunConfig()
    )
    return conversation, group


def run_of(ctx: ToolContext[Any]) -> str:
    """The default run of a tool call: the conversation bound (`bind_run`, `run_agent`),
    else the run config's group id; else `UnnamedRun` is raised."""
    bound = _bound.get()
    run = bound.run() if bound is not None else None
    if run is not None:
        return run
    group_id = _name(ctx.run_config.group_id if ctx.run_config is not None else None)
    if group_id is not None:
        return f"{PREFIX}:group:{group_id}"
    raise UnnamedRun(
        "an OpenAI Agents SDK effect needs a run that survives a restart, and this call has "
        f"none (its call id {ctx.tool_call_id!r} is new every time the model is asked): run "
        "the agent with run_agent(agent, input, session=...) or inside bind_run(session=...), "
        "give the run config a group_id per conversation, or name the run: "
        "effect_tool(..., run=lambda ctx: ...) (from your context, say)"
    )


def asker_of(ctx: ToolContext[Any]) -> str | None:
    """Who asked, for the record: `<tool>:<call_id>`. Evidence only: it never decides the
    intent."""
    return asker(ctx.tool_name, ctx.tool_call_id)


async def tool_effect(
    ctx: ToolContext[Any],
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
    """Inside a function tool of your own (`@function_tool(failure_error_function=None)`,
    its first parameter a `ToolContext`): the effect this call asks for, keyed by the act
    (see the module's docstring), as the answer the model reads (`answers.summary`), or
    the refusal it reads (`kind: "refused"`). `repeat` is the model's deliberate repeat.
    `UnnamedRun` and what no call can fix (a payload the ledger cannot record among it)
    are raised: made without `failure_error_function=None`, the SDK would answer them
    "Please try again"."""
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
    return await aanswer(effects, intent, wait=wait, repeatable=repeatable, refuse=refused)


def effect_tool(
    effects: Effects,
    *,
    name: str,
    description: str,
    args_schema: type[BaseModel],
    tenant: str,
    action: str,
    authorization_ref: str | Callable[[ToolContext[Any]], str],
    effect_of: EffectOf,
    wait: float | timedelta | None = 30.0,
    intent_fields: Sequence[str] | None = None,
    repeatable: bool = True,
    run: RunOf | None = None,
    needs_approval: bool | Callable[..., Any] = False,
    strict: bool = True,
) -> FunctionTool:
    """An Agents SDK `FunctionTool` (for `Agent(tools=[...])`) whose call is an opledger
    effect, keyed by the act it asks for, never by its call id; it waits with
    `Effects.aask` (the event loop is never blocked).

    The model sees `args_schema`'s fields as the tool's arguments (a strict JSON schema
    unless `strict=False`); `effect_of(args)` gives the target and the payload of the
    validated arguments as JSON-ready values (a dict, `model_dump(mode="json")`); the
    action's intent fields (`intent_fields`, else what its adapter declares) are payload
    fields. `authorization_ref` may depend on the call's context (`ctx.context`); `run(ctx)`
    names the run (default `run_of`: the conversation bound by `run_agent` or `bind_run`,
    else the run config's group id, else `UnnamedRun`). With `repeatable` (the default)
    the tool takes an optional integer `repeat` argument the model sets only to ask for the
    same act again on purpose (2 for the second time); without it, the act happens at most
    once per run (per tenant, for an action of the tenant's scope). An `args_schema` with a
    `repeat` field of its own needs `repeatable=False` (raises `ValueError`).
    `needs_approval` is the SDK's: the run stops for a person's approval before the call
    (`RunState.approve`); a call approved and run again after a crash is answered with the
    recorded operation.

    The tool's output (what the model reads) is the result as JSON (`answers.summary`); a
    refusal the call caused is output too, JSON with `kind: "refused"`, and the run goes
    on; what no call can fix (a payload `effect_of` built that the ledger cannot record
    among it) is raised.
    """
    arguments = arguments_of(args_schema, repeatable=repeatable)
    call: EffectCall[ToolContext[Any]] = EffectCall(
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
    tool = FunctionTool(
        name=name,
        description=description,
        params_json_schema=arguments.model_json_schema(),
        on_invoke_tool=_Invoke(call, arguments),
        strict_json_schema=strict,
        needs_approval=needs_approval,
    )
    # no formatter: a cancelled call ends the run, never "An error occurred ... try again"
    return set_function_tool_failure_error_function(tool, None)


@dataclass(frozen=True)
class _Invoke:
    """An `effect_tool`'s `on_invoke_tool`: its arguments validated, then the call."""

    call: EffectCall[ToolContext[Any]]
    arguments: type[BaseModel]

    async def __call__(self, ctx: ToolContext[Any], arguments: str) -> str:
        try:
            args = self.arguments.model_validate_json(arguments or "{}")
        except ValidationError as exc:  # the model can fix its arguments: it reads why
            why = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors()
            )
            return _json(refusal("InvalidArguments", f"the arguments are not valid: {why}"))
        return _json(await self.call.aanswer(ctx, args, refused))


def _json(answer: dict[str, Any]) -> str:
    return json.dumps(answer, sort_keys=True, default=str)


def _name(value: object) -> str | None:
    """A name given (stripped), or None for none or a blank one."""
    return value.strip() if isinstance(value, str) and value.strip() else None


def _session_id(session: Session | None) -> str | None:
    """The session's id, if it has one now (an `OpenAIConversationsSession` has none until
    its conversation is made, on first use)."""
    if session is None:
        return None
    try:
        session_id = session.session_id
    except Exception:  # a session that cannot tell has none to key by
        return None
    return _name(session_id)
