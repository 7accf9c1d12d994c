"""Pydantic AI tools (`opledger.agents.pydantic_ai`) called by a real Pydantic AI agent
whose model (a `FunctionModel`) gives its tool calls new ids every time it is asked, on a
real Postgres, with the test in the worker's place: one operation per act whatever the
call id, the call id kept as who asked, refusals the model reads while the run goes on,
and the run each call is keyed by (a run you name, a DBOS workflow, a Temporal workflow;
none refused)."""

from __future__ import annotations

import asyncio
import json
import types
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from opledger.agents import Effects
from opledger.agents import pydantic_ai as pai
from opledger.ledger import Binding, Confirmed, Ledger
from tests.conftest import PostgresServer


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
    """The agent's deps: the run is the ticket's."""

    ticket: str


class CloseArgs(BaseModel):
    case_id: str


class EmailArgs(BaseModel):
    to: str
    text: str = ""


class Script:
    """A model asked for tool calls in its first turn, then done: each call under a new
    id every time it is asked, as a real model's."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.ids: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[TextPart("done")])
        parts = []
        for name, args in self.calls:
            self.ids.append(f"call_{uuid.uuid4().hex[:8]}")
            parts.append(ToolCallPart(name, args, tool_call_id=self.ids[-1]))
        return ModelResponse(parts=parts)


def _run(agent: Any, prompt: str, **options: Any) -> Any:
    """`agent.run` to its end in a loop of its own, closed after (Pydantic AI's `run_sync`
    leaves the loop it made open: a ResourceWarning in whatever test the GC reaches it)."""
    return asyncio.run(agent.run(prompt, **options))


def ticket_run(ctx: RunContext[Ticket]) -> str:
    return f"support:{ctx.deps.ticket}"


def _close(effects: Effects, **kw: Any) -> Any:
    return pai.effect_tool(
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
    return pai.effect_tool(
        effects,
        name="email",
        description="Email someone",
        args_schema=EmailArgs,
        tenant="acme",
        action="email.send.v1",
        authorization_ref=lambda ctx: "auth_acme",
        effect_of=lambda a: (a["to"], {"to": a["to"], "subject": "hi", "text": a["text"]}),
        wait=None,
        **kw,
    )


def _answers(result: Any) -> list[tuple[str, Any]]:
    """The tool results the run's model read: (outcome, content as a dict)."""
    out: list[tuple[str, Any]] = []
    for message in result.all_messages():
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                content = part.content
                out.append(
                    (part.outcome, json.loads(content) if isinstance(content, str) else content)
                )
    return out


def _settle(ledger: Ledger, op_id: str) -> None:
    claim = ledger.claim(op_id, owner="test-worker")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    ledger.record_outcome(claim, Confirmed(receipt_id=f"r-{op_id}", binding=binding))


def test_a_tool_call_is_one_effect_per_act_whatever_its_call_id(
    ledger: Ledger, effects: Effects
) -> None:
    script = Script()
    agent = Agent(FunctionModel(script), deps_type=Ticket, tools=[_close(effects, run=ticket_run)])
    schema = agent._function_toolset.tools["close_case"].tool_def.parameters_json_schema
    assert set(schema["properties"]) == {"case_id", "repeat"}
    assert "Leave this out" in schema["properties"]["repeat"]["description"]

    def ask(**args: Any) -> dict[str, Any]:
        script.calls = [("close_case", {"case_id": "case-318", **args})]
        ((outcome, answer),) = _answers(_run(agent, "close it", deps=Ticket("t-7")))
        assert outcome == "success"
        return dict(answer)

    first = ask()
    op = ledger.get(first["op_id"])
    assert (op.workflow_id, op.target) == ("support:t-7", "case-318")
    assert first["kind"] == "pending" and first["asked_before"] is False
    # the agent run again: the model asks again under a new id: the recorded operation
    again = ask()
    assert again["op_id"] == op.id and again["asked_before"] is True
    assert "already asked" in again["message"] and "Wait for it" in again["message"]
    # the call id is evidence of who asked, never the key
    assert [a.asked_by for a in ledger.asks(op.id)] == [f"close_case:{i}" for i in script.ids]
    _settle(ledger, op.id)
    done = ask()
    assert done["kind"] == "confirmed" and "`repeat` set to 2" in done["message"]
    # a deliberate repeat says so with a number; the first time is the recorded act
    second = ask(repeat=2)
    assert second["op_id"] != op.id and second["asked_before"] is False
    assert ask(repeat=2)["op_id"] == second["op_id"]
    assert ask(repeat=1)["op_id"] == op.id
    # another ticket is another run; the close is the tenant's act: the first run's op
    other = dict(_answers(_run(agent, "again", deps=Ticket("t-8")))[0][1])
    assert other["op_id"] == op.id and other["asked_before"]
    assert len(ledger.list(tenant="acme")) == 2


def test_a_refusal_is_a_failed_tool_result_the_model_reads_and_the_run_goes_on(
    ledger: Ledger, effects: Effects
) -> None:
    script = Script()
    agent = Agent(
        FunctionModel(script),
        deps_type=Ticket,
        tools=[_email(effects, run=ticket_run, repeatable=False)],
    )
    schema = agent._function_toolset.tools["email"].tool_def.parameters_json_schema
    assert "repeat" not in schema["properties"]
    script.calls = [("email", {"to": "a@acme.test", "text": "first wording"})]
    ((_, sent),) = _answers(_run(agent, "mail", deps=Ticket("t-9")))
    _settle(ledger, sent["op_id"])
    ledger.revoke("auth_acme", by="test", reason="the run is over")
    script.calls = [
        ("email", {"to": "a@acme.test", "text": "reworded"}),  # recorded: answered
        ("email", {"to": "b@acme.test", "text": "x"}),  # a new act, no grant: refused
        ("email", {"to": "c\u200b@acme.test"}),  # an invisible character: refused
    ]
    result = _run(agent, "mail again", deps=Ticket("t-9"))
    assert result.output == "done"  # the run went on
    (ok, again), (failed, revoked), (failed_too, invalid) = _answers(result)
    assert ok == "success" and again["op_id"] == sent["op_id"] and again["asked_before"]
    assert again["differs"] == ["payload.text"] and "at most once" in again["message"]
    assert failed == failed_too == "failed"
    assert revoked["kind"] == "refused" and revoked["error"] == "AuthorizationRevoked"
    assert "nothing was sent" in revoked["message"]
    assert invalid["kind"] == "refused" and invalid["error"] == "InvalidIdentifier"
    assert [o.target for o in ledger.list(tenant="acme")] == ["a@acme.test"]


def test_a_run_must_survive_a_restart_or_the_tool_refuses_to_key_it(
    ledger: Ledger, effects: Effects, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script()
    script.calls = [("close_case", {"case_id": "case-7"})]
    agent = Agent(FunctionModel(script), tools=[_close(effects)])
    with pytest.raises(pai.UnnamedRun, match="no DBOS or Temporal workflow"):
        _run(agent, "close it", run_id="run-1")  # a run id of one run is not enough
    assert not ledger.list(tenant="acme")
    # the conversation, where the caller names it
    named = Agent(FunctionModel(script), tools=[_close(effects, run=pai.conversation_run)])
    ((_, answer),) = _answers(_run(named, "close it", conversation_id="conv-1"))
    assert ledger.get(answer["op_id"]).workflow_id == "pydantic-ai:conversation:conv-1"
    # a Temporal activity's workflow id (the engine as its modules answer, in this process)
    activity = types.SimpleNamespace(
        in_activity=lambda: True,
        info=lambda: types.SimpleNamespace(workflow_id="wf-t", run_id="r-1"),
    )
    monkeypatch.setitem(__import__("sys").modules, "temporalio.activity", activity)
    script.calls = [("close_case", {"case_id": "case-8"})]
    ((_, answer),) = _answers(_run(agent, "close it"))
    assert ledger.get(answer["op_id"]).workflow_id == "temporal:wf-t"


@pytest.fixture
def dbos_url(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_pai_dbos")
    yield url
    pg_server.drop_database(url)


def test_in_a_dbos_workflow_the_run_is_the_workflow(
    ledger: Ledger, effects: Effects, dbos_url: str
) -> None:
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    script = Script()
    script.calls = [("close_case", {"case_id": "case-9"})]
    agent = Agent(
        FunctionModel(script),
        name="pai_test_closer",
        tools=[_close(effects)],
        capabilities=[DBOSDurability()],
    )

    @DBOS.workflow(name="pai_test_close")
    async def close() -> list[str]:
        result = await agent.run("close it")
        return [a["op_id"] for _, a in _answers(result)]

    DBOS(config={"name": "opledger-pai-test", "system_database_url": dbos_url})
    DBOS.launch()
    try:
        with SetWorkflowID("wf-1"):
            (op_id,) = cast(list[str], DBOS.start_workflow(close).get_result())
    finally:
        DBOS.destroy(destroy_registry=True)
    op = ledger.get(op_id)
    assert op.workflow_id == "dbos:wf-1"
    assert [a.asked_by for a in ledger.asks(op_id)] == [f"close_case:{script.ids[0]}"]
