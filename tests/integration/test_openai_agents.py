"""OpenAI Agents SDK tools (`opledger.agents.openai_agents`) called by a real Agents SDK
run whose model gives its tool calls new ids every time it is asked, on a real Postgres,
with the test in the worker's place: one operation per act whatever the call id, the call
id kept as who asked, refusals the model reads while the run goes on, and the run each
call is keyed by (the session, the conversation, the group, a run you name; none refused,
and the run ends)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from agents import (
    Agent,
    ModelResponse,
    RunConfig,
    Runner,
    RunResult,
    SQLiteSession,
    Usage,
    UserError,
    set_tracing_disabled,
)
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from pydantic import BaseModel

from opledger.agents import Effects
from opledger.agents import openai_agents as oa
from opledger.ledger import Binding, Confirmed, Ledger


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # no exporter reaching out to OpenAI
    yield


class Published(list[str]):
    def __call__(self, op_id: str) -> None:
        self.append(op_id)


@pytest.fixture
def effects(ledger: Ledger, grant: str) -> Effects:
    """Effects over a ledger that knows the bundled adapters' intent fields, as
    `opledger.tasks.app.runtime().ledger` does; dispatches go nowhere (no worker)."""
    from opledger.adapters.crm import CrmAdapter
    from opledger.adapters.email import EmailAdapter
    from opledger.adapters.registry import Registry

    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    return Effects(Ledger(ledger.engine, actions=registry), publish=Published(), poll=30.0)


@dataclass
class Ticket:
    """The run's context: a run named by the ticket."""

    ticket: str


class CloseArgs(BaseModel):
    case_id: str


class EmailArgs(BaseModel):
    to: str
    text: str = ""


class Script(Model):
    """A model asked for `calls` in its first turn, then done: each call under a new id
    every time it is asked, as a real model's."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.ids: list[str] = []

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = input
        if not isinstance(items, str) and items[-1].get("type") == "function_call_output":
            return ModelResponse(
                output=[assistant_message("done")], usage=Usage(), response_id=None
            )
        output = []
        for name, arguments in self.calls:
            self.ids.append(f"call_{uuid.uuid4().hex[:8]}")
            output.append(function_call(name, arguments, call_id=self.ids[-1]))
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _close(effects: Effects, **kw: Any) -> Any:
    return oa.effect_tool(
        effects,
        name="close_case",
        description="Close a CRM case",
        args_schema=CloseArgs,
        tenant="acme",
        action="crm.close_case.v1",
        authorization_ref="auth_acme",
        effect_of=lambda a: (a["case_id"], {"note": f"closed ({a['case_id']})"}),
        wait=None,
        **kw,
    )


def _email(effects: Effects, **kw: Any) -> Any:
    return oa.effect_tool(
        effects,
        name="email",
        description="Email someone",
        args_schema=EmailArgs,
        tenant="acme",
        action=kw.pop("action", "email.send.v1"),
        authorization_ref=lambda ctx: "auth_acme",
        effect_of=lambda a: (a["to"], {"to": a["to"], "subject": "hi", "text": a["text"]}),
        wait=None,
        **kw,
    )


def _answers(result: RunResult) -> list[dict[str, Any]]:
    """The tool outputs the run's model read, in order, as dicts."""
    return [
        json.loads(str(item.output))
        for item in result.new_items
        if item.type == "tool_call_output_item"
    ]


def _settle(ledger: Ledger, op_id: str) -> None:
    claim = ledger.claim(op_id, owner="test-worker")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    ledger.record_outcome(claim, Confirmed(receipt_id=f"r-{op_id}", binding=binding))


def test_a_tool_call_is_one_effect_per_act_whatever_its_call_id(
    ledger: Ledger, effects: Effects
) -> None:
    model = Script()
    tool = _email(effects)
    agent = Agent(name="mailer", model=model, tools=[tool])
    assert set(tool.params_json_schema["properties"]) == {"to", "text", "repeat"}
    assert "Leave this out" in tool.params_json_schema["properties"]["repeat"]["description"]
    session = SQLiteSession("t-7")  # in memory: enough within one process

    def ask(**args: Any) -> dict[str, Any]:
        model.calls = [("email", {"to": "a@acme.test", "text": "hello", "repeat": None, **args})]
        (answer,) = _answers(asyncio.run(oa.run_agent(agent, "mail them", session=session)))
        return answer

    first = ask()
    op = ledger.get(first["op_id"])
    assert (op.workflow_id, op.target) == ("openai-agents:session:t-7", "a@acme.test")
    assert first["kind"] == "pending" and first["asked_before"] is False
    # asked again under a new id, reworded: the recorded operation, what differs named
    again = ask(text="hello, reworded")
    assert again["op_id"] == op.id and again["asked_before"] is True
    assert again["differs"] == ["payload.text"]
    assert "already asked" in again["message"] and "Wait for it" in again["message"]
    # the call id is evidence of who asked, never the key
    assert [a.asked_by for a in ledger.asks(op.id)] == [f"email:{i}" for i in model.ids]
    _settle(ledger, op.id)
    done = ask()
    assert done["kind"] == "confirmed" and "`repeat` set to 2" in done["message"]
    # a deliberate repeat says so with a number; the first time is the recorded act
    second = ask(repeat=2)
    assert second["op_id"] != op.id and second["asked_before"] is False
    assert (ask(repeat=2))["op_id"] == second["op_id"]
    assert (ask(repeat=1))["op_id"] == op.id
    # another session is another run: another act
    model.calls = [("email", {"to": "a@acme.test", "text": "hello", "repeat": None})]
    (other,) = _answers(asyncio.run(oa.run_agent(agent, "mail", session=SQLiteSession("t-8"))))
    assert other["asked_before"] is False
    assert ledger.get(other["op_id"]).workflow_id == "openai-agents:session:t-8"


def test_a_refusal_is_output_the_model_reads_and_the_run_goes_on(
    ledger: Ledger, effects: Effects
) -> None:
    model = Script()
    agent = Agent(name="mailer", model=model, tools=[_email(effects, repeatable=False)])
    assert "repeat" not in agent.tools[0].params_json_schema["properties"]  # type: ignore[union-attr]
    run = RunConfig(group_id="thread-9")  # the run config's group: the run, unbound
    model.calls = [("email", {"to": "a@acme.test", "text": "first wording"})]
    (sent,) = _answers(asyncio.run(Runner.run(agent, "mail", run_config=run)))
    assert ledger.get(sent["op_id"]).workflow_id == "openai-agents:group:thread-9"
    _settle(ledger, sent["op_id"])
    ledger.revoke("auth_acme", by="test", reason="the run is over")
    model.calls = [
        ("email", {"to": "a@acme.test", "text": "reworded"}),  # recorded: answered
        ("email", {"to": "b@acme.test", "text": "x"}),  # a new act, no grant: refused
        ("email", {"to": "c\u200b@acme.test", "text": ""}),  # an invisible character
        ("email", {"to": 7}),  # arguments the schema refuses
        ("email", "{not json"),
    ]
    result = asyncio.run(Runner.run(agent, "mail again", run_config=run))
    assert result.final_output == "done"  # the run went on
    again, revoked, invalid, wrong, garbled = _answers(result)
    assert again["op_id"] == sent["op_id"] and again["asked_before"]
    assert again["differs"] == ["payload.text"] and "at most once" in again["message"]
    assert revoked["kind"] == "refused" and revoked["error"] == "AuthorizationRevoked"
    assert "nothing was sent" in revoked["message"]
    assert invalid["kind"] == "refused" and invalid["error"] == "InvalidIdentifier"
    assert wrong["kind"] == garbled["kind"] == "refused"
    assert wrong["error"] == garbled["error"] == "InvalidArguments"
    assert "to: Input should be a valid string" in wrong["message"]
    assert [o.target for o in ledger.list(tenant="acme")] == ["a@acme.test"]


def test_a_run_must_survive_a_restart_or_the_tool_refuses_to_key_it(
    ledger: Ledger, effects: Effects
) -> None:
    model = Script()
    model.calls = [("close_case", {"case_id": "case-7", "repeat": None})]
    agent = Agent(name="closer", model=model, tools=[_close(effects)])
    # no session, conversation or group: the run's only ids are new next time
    with pytest.raises(UserError) as raised:
        asyncio.run(Runner.run(agent, "close it", run_config=RunConfig(group_id="  ")))
    assert isinstance(raised.value.__cause__, oa.UnnamedRun)
    with pytest.raises(UserError) as raised:
        asyncio.run(oa.run_agent(agent, "close it"))  # bound, but to nothing
    assert isinstance(raised.value.__cause__, oa.UnnamedRun)
    assert "run_agent(agent, input, session=...)" in str(raised.value.__cause__)
    assert not ledger.list(tenant="acme")
    # bound around Runner.run: the conversation first, then the session, then the group
    with oa.bind_run(conversation_id="conv_1", session=SQLiteSession("s-1"), group_id="g"):
        (answer,) = _answers(asyncio.run(Runner.run(agent, "close it")))
    assert ledger.get(answer["op_id"]).workflow_id == "openai-agents:conversation:conv_1"
    model.calls = [("close_case", {"case_id": "case-8", "repeat": None})]
    with oa.bind_run(session=SQLiteSession("s-1"), group_id="g"):
        (answer,) = _answers(asyncio.run(Runner.run(agent, "close it")))
    assert ledger.get(answer["op_id"]).workflow_id == "openai-agents:session:s-1"
    # a run you name from the run's context wins over what is bound
    named = Agent(
        name="closer",
        model=model,
        tools=[_close(effects, run=lambda ctx: f"support:{ctx.context.ticket}")],
    )
    model.calls = [("close_case", {"case_id": "case-9", "repeat": None})]
    result = asyncio.run(
        oa.run_agent(named, "close it", session=SQLiteSession("s-2"), context=Ticket("t"))
    )
    assert ledger.get(_answers(result)[0]["op_id"]).workflow_id == "support:t"


def test_what_no_call_can_fix_ends_the_run(ledger: Ledger, effects: Effects) -> None:
    model = Script()
    model.calls = [("email", {"to": "a@acme.test", "text": "", "repeat": None})]
    agent = Agent(name="m", model=model, tools=[_email(effects, action="nosuch.send.v1")])
    with pytest.raises(UserError) as raised:
        asyncio.run(oa.run_agent(agent, "mail", session=SQLiteSession("s-3")))
    assert type(raised.value.__cause__).__name__ == "UnknownAction"
    assert not ledger.list(tenant="acme")


def test_a_repeatable_tool_takes_no_repeat_field_of_its_own(effects: Effects) -> None:
    class WithRepeat(BaseModel):
        repeat: int

    def tool(**kw: Any) -> Any:
        return oa.effect_tool(
            effects,
            name="t",
            description="d",
            args_schema=WithRepeat,
            tenant="acme",
            action="email.send.v1",
            authorization_ref="auth_acme",
            effect_of=lambda a: ("x", {}),
            **kw,
        )

    with pytest.raises(ValueError, match="repeatable=False"):
        tool()
    assert tool(repeatable=False).params_json_schema["required"] == ["repeat"]


def _approved(agent: Agent[Any], saved: str) -> Any:
    """The saved run's state, every call it stopped for approved."""
    from agents import RunState

    state = asyncio.run(RunState.from_string(agent, saved))
    for item in state.get_interruptions():
        state.approve(item)
    return state


def test_a_run_resumed_from_its_state_is_keyed_by_the_conversation_it_resumes(
    ledger: Ledger, effects: Effects
) -> None:
    model = Script()
    model.calls = [("close_case", {"case_id": "case-5", "repeat": None})]
    agent = Agent(name="closer", model=model, tools=[_close(effects, needs_approval=True)])
    stopped = asyncio.run(oa.run_agent(agent, "close it", conversation_id="conv_5"))
    assert stopped.interruptions and not ledger.list(tenant="acme")
    saved = stopped.to_state().to_string()
    # resumed under a run config with a group: the SDK resumes the state's conversation
    group = RunConfig(group_id="g-5")
    (closed,) = _answers(
        asyncio.run(oa.run_agent(agent, _approved(agent, saved), run_config=group))
    )
    assert ledger.get(closed["op_id"]).workflow_id == "openai-agents:conversation:conv_5"
    # killed after the approval, resumed again from the same saved state, nothing else given
    (again,) = _answers(asyncio.run(oa.run_agent(agent, _approved(agent, saved))))
    assert again["op_id"] == closed["op_id"] and again["asked_before"]
    # a run grouped by its run config: resumed under it (with the SDK's tracing off, the
    # state keeps no trace group), else no run: refused, nothing keyed by another run
    model.calls = [("close_case", {"case_id": "case-6", "repeat": None})]
    grouped = asyncio.run(oa.run_agent(agent, "close it", run_config=RunConfig(group_id="g-6")))
    saved = grouped.to_state().to_string()
    with pytest.raises(UserError) as raised:
        asyncio.run(oa.run_agent(agent, _approved(agent, saved)))
    assert isinstance(raised.value.__cause__, oa.UnnamedRun)
    group = RunConfig(group_id="g-6")
    (answer,) = _answers(
        asyncio.run(oa.run_agent(agent, _approved(agent, saved), run_config=group))
    )
    assert ledger.get(answer["op_id"]).workflow_id == "openai-agents:group:g-6"
