"""A LangGraph graph whose tool asks for an act held for a person's approval, on a real
Postgres: with `pause_for_approval` the graph pauses (LangGraph's interrupt, the held
answer its value) instead of answering the model; resumed before anyone decided it pauses
again, never asking for a second approval; resumed after the approval, the same call asks
again and is answered with the same operation, released for a worker; the model asked
again under a new call id gets that operation too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import BaseModel

from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.agents import Effects
from opledger.agents.langgraph import effect_tool
from opledger.console.accounts import Accounts
from opledger.ledger import Ledger

REFUND = "stripe.refund.v1"


class Refund(BaseModel):
    charge: str
    amount: int


@pytest.fixture
def held(ledger: Ledger) -> Ledger:
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval(REFUND, {"when": [{"field": "amount", "above": 10000}]})
    ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_s")
    Accounts(ledger.engine).add(
        "alice", tenants=["acme"], password=None, by="test", approves=["stripe.*"]
    )
    return Ledger(ledger.engine, actions=registry)


def _graph(effects: Effects) -> Any:
    """A graph whose one node runs the refund tool on the model's message (no model: the
    test writes the AI message a model would)."""
    refund = effect_tool(
        effects,
        name="refund",
        description="Refund part of a charge.",
        args_schema=Refund,
        tenant="acme",
        action=REFUND,
        authorization_ref="auth_s",
        effect_of=lambda a: (a["charge"], {"amount": a["amount"], "reason": "duplicate"}),
        wait=0.2,
        pause_for_approval=True,
    )
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([refund]))
    graph.add_edge(START, "tools")
    return graph.compile(checkpointer=InMemorySaver())


def _asked(call_id: str) -> dict[str, Any]:
    call = {"name": "refund", "args": {"charge": "ch_1", "amount": 25000}, "id": call_id}
    return {"messages": [AIMessage(content="", tool_calls=[call])]}


def _answer(state: dict[str, Any]) -> dict[str, Any]:
    message = state["messages"][-1]
    assert isinstance(message, ToolMessage), message
    answer: dict[str, Any] = json.loads(str(message.content))
    return answer


def test_the_graph_pauses_for_approval_and_resumes_without_asking_twice(held: Ledger) -> None:
    published: list[str] = []
    graph = _graph(Effects(held, publish=published.append, poll=30.0))
    config: Any = {"configurable": {"thread_id": "t-1"}}
    paused = graph.invoke(_asked("call_1"), config)
    (pause,) = paused["__interrupt__"]
    held_answer = pause.value
    assert (held_answer["kind"], held_answer["awaiting"]) == ("pending", "approval")
    op_id = held_answer["op_id"]
    assert graph.get_state(config).next == ("tools",)  # paused in the tool node
    assert published == [] and len(held.approvals(tenant="acme")) == 1

    again = graph.invoke(Command(resume="checked"), config)  # nobody decided yet
    assert again["__interrupt__"][0].value["op_id"] == op_id  # paused again
    assert len(held.approvals(tenant="acme", status=None)) == 1  # never a second request

    approval = held.approval(op_id)
    held.approve(op_id, operator="alice", digest=approval.payload_digest)
    done = graph.invoke(Command(resume="approved"), config)
    assert "__interrupt__" not in done
    answer = _answer(done)
    assert answer["op_id"] == op_id and answer["asked_before"] is True
    assert answer["awaiting"] == "worker"  # released: a worker sends it
    assert published == [op_id]

    # the model asked again in the thread, under a new call id: the same operation
    other = graph.invoke(_asked("call_2"), config)
    assert _answer(other)["op_id"] == op_id
    assert len(held.approvals(tenant="acme", status=None)) == 1


def test_a_denial_resumes_into_an_answer_the_model_reads(held: Ledger) -> None:
    graph = _graph(Effects(held, publish=lambda op_id: None, poll=30.0))
    config: Any = {"configurable": {"thread_id": "t-2"}}
    paused = graph.invoke(_asked("call_1"), config)
    op_id = paused["__interrupt__"][0].value["op_id"]
    digest = held.approval(op_id).payload_digest
    held.deny(op_id, operator="alice", digest=digest, note="wrong customer")
    answer = _answer(graph.invoke(Command(resume="denied"), config))
    assert answer["kind"] == "cancelled" and "denied by alice" in answer["reason"]
