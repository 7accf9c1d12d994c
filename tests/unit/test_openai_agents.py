"""The run and the asker of an OpenAI Agents SDK tool call (`opledger.agents.openai_agents`),
without a database: the SDK's own order (conversation, session, group), a session that has
no id yet, the binding's reach (tasks started in the block, nothing after it), and the call
id kept as evidence only."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agents import RunConfig, SQLiteSession
from agents.tool_context import ToolContext

from opledger.agents import openai_agents as oa


def _ctx(call_id: str = "call_1", group_id: str | None = None, tool: str = "close") -> Any:
    config = RunConfig(group_id=group_id) if group_id is not None else None
    return ToolContext(
        context=None, tool_name=tool, tool_call_id=call_id, tool_arguments="{}", run_config=config
    )


class NoIdYet:
    """A session that makes its conversation on first use (`OpenAIConversationsSession`)."""

    def __init__(self) -> None:
        self.made: str | None = None

    @property
    def session_id(self) -> str:
        if self.made is None:
            raise ValueError("no conversation yet")
        return self.made


def test_the_run_is_the_conversation_then_the_session_then_the_group() -> None:
    session = SQLiteSession("s-1")
    both = oa.Conversation(conversation_id="conv_1", session=session, group_id="g-1")
    assert both.run() == "openai-agents:conversation:conv_1"
    assert oa.Conversation(session=session, group_id="g-1").run() == "openai-agents:session:s-1"
    assert oa.Conversation(conversation_id=" ", group_id=" g-1 ").run() == "openai-agents:group:g-1"
    assert oa.Conversation().run() is None


def test_a_session_is_read_when_the_tool_runs() -> None:
    session = NoIdYet()
    with oa.bind_run(session=session):  # type: ignore[arg-type]
        with pytest.raises(oa.UnnamedRun, match="call_1"):
            oa.run_of(_ctx())
        session.made = "conv_made_on_first_use"
        assert oa.run_of(_ctx()) == "openai-agents:session:conv_made_on_first_use"


def test_unbound_the_run_is_the_run_configs_group_else_none() -> None:
    assert oa.run_of(_ctx(group_id="thread-4")) == "openai-agents:group:thread-4"
    for ctx in (_ctx(), _ctx(group_id=""), _ctx(group_id="   ")):
        with pytest.raises(oa.UnnamedRun, match="new every time the model is asked"):
            oa.run_of(ctx)
    # a binding with nothing in it falls back to the group, as an unbound call does
    with oa.bind_run():
        assert oa.run_of(_ctx(group_id="thread-4")) == "openai-agents:group:thread-4"


def test_a_binding_reaches_the_tasks_started_in_it_and_ends_with_the_block() -> None:
    async def tool_task() -> str:
        return oa.run_of(_ctx())

    async def main() -> tuple[str, str]:
        with oa.bind_run(session=SQLiteSession("outer")):
            task = asyncio.create_task(tool_task())  # as the runner starts a tool's
            with oa.bind_run(session=SQLiteSession("inner")):
                inner = await asyncio.create_task(tool_task())
            return await task, inner

    assert asyncio.run(main()) == ("openai-agents:session:outer", "openai-agents:session:inner")
    with pytest.raises(oa.UnnamedRun):
        oa.run_of(_ctx())


def test_the_call_id_is_who_asked_never_the_run() -> None:
    with oa.bind_run(group_id="g"):
        assert oa.run_of(_ctx("call_a")) == oa.run_of(_ctx("call_b"))
    assert oa.asker_of(_ctx("call_a")) == "close:call_a"
    assert oa.asker_of(_ctx("call\x00b")) == "close:call?b"  # evidence, never refused
    assert oa.asker_of(_ctx("  ")) == "close"


class Cancelled:
    """Effects whose wait is cancelled (as a task cancelled under the tool would be)."""

    async def aask(self, intent: Any, wait: Any = None) -> Any:
        raise asyncio.CancelledError


def test_a_cancelled_call_ends_the_run_and_is_never_answered_try_again() -> None:
    from agents import Agent, ModelResponse, Runner, Usage, set_tracing_disabled
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from pydantic import BaseModel

    class Args(BaseModel):
        case_id: str

    class Asks(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            if isinstance(input, list) and input[-1].get("type") == "function_call_output":
                return ModelResponse(
                    output=[assistant_message(str(input[-1]["output"]))],
                    usage=Usage(),
                    response_id=None,
                )
            call = function_call("close", {"case_id": "c", "repeat": None}, call_id="call_1")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    set_tracing_disabled(True)
    tool = oa.effect_tool(
        Cancelled(),  # type: ignore[arg-type]
        name="close",
        description="Close a case",
        args_schema=Args,
        tenant="acme",
        action="crm.close_case.v1",
        authorization_ref="auth_acme",
        effect_of=lambda a: (a["case_id"], {}),
    )
    agent = Agent(name="closer", model=Asks(), tools=[tool])
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(Runner.run(agent, "close it", run_config=RunConfig(group_id="g")))


def test_a_resumed_run_binds_what_the_sdk_resumes_it_with() -> None:
    from types import SimpleNamespace

    from agents.tracing.traces import TraceState

    def state(conversation: str | None, group: str | None) -> Any:
        trace = TraceState(trace_id="trace_1", group_id=group) if group else None
        return SimpleNamespace(
            _conversation_id=conversation,
            _previous_response_id=None,
            _auto_previous_response_id=False,
            _trace_state=trace,
        )

    # the conversation given, else the state's; the run config's group, else the state's
    assert oa._resumed(state("conv_1", "g-1"), None, None, {}) == ("conv_1", "g-1")
    assert oa._resumed(state("conv_1", "g-1"), "conv_2", RunConfig(group_id="g-2"), {}) == (
        "conv_2",
        "g-2",
    )
    assert oa._resumed(state(None, None), None, None, {}) == (None, None)
