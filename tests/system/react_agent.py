"""A ReAct-style LangGraph agent built the way users build them, for the system tests.

An agent node calls a chat model; `ToolNode` runs its tool calls (in parallel threads, as
LangGraph does); `tools_condition` loops back; the Postgres checkpointer saves the thread.
The tools are `effect_tool`s. The chat model (`ReAskingModel`) is a real `BaseChatModel`
with no network: like every real chat model API it gives its tool calls **new random ids
each time it is asked**, and rewords the email body each time, so a re-asked turn never
repeats an id or a body. Its plan, from the conversation so far:

1. close the case;
2. once the close is confirmed, two tool calls in one message: update the case's priority
   (an update the CRM applies every time it is sent under a new key) and email the owner;
3. a final answer.

    python tests/system/react_agent.py run    --thread T --case C --owner O [--graph react]
                                              [--durability sync|async|exit]
    python tests/system/react_agent.py resume --thread T
    python tests/system/react_agent.py travel --thread T --to first-turn|first-tools
    python tests/system/react_agent.py fork   --thread T --owner O2 --grant G

Each prints the thread's messages as one JSON line at the end. Needs the stack's
environment (database, broker, providers: `stack_env`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from opledger.agents import Effects
from opledger.agents.langgraph import effect_tool
from opledger.tasks.app import runtime

TENANT = "acme"
CRM = "crm"  # the keyed CRM with a status API (KINDS[0] of the chaos variants)
GRANT = "auth_agent"
PLAN_ID = "plan"  # the human message's id: a fork replaces it
WAIT_S = float(os.environ.get("AGENT_WAIT_S", "30"))


class CaseArgs(BaseModel):
    case_id: str


class UpdateArgs(BaseModel):
    case_id: str
    priority: str
    note: str = ""


class EmailArgs(BaseModel):
    to: str
    subject: str
    text: str


def _answers(messages: Sequence[BaseMessage]) -> dict[str, dict[str, Any]]:
    """The tool answers so far, by tool name (the last answer of each)."""
    return {str(m.name): json.loads(str(m.content)) for m in messages if isinstance(m, ToolMessage)}


class ReAskingModel(BaseChatModel):
    """A chat model that follows the plan above and invents new tool-call ids (and a new
    wording of the email) every time it is asked."""

    @property
    def _llm_type(self) -> str:
        return "re-asking-test-model"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ReAskingModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        plan = json.loads(str(next(m for m in messages if isinstance(m, HumanMessage)).content))
        answers = _answers(messages)

        def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
            return {
                "id": f"call_{uuid.uuid4().hex}",
                "name": name,
                "args": args,
                "type": "tool_call",
            }

        if "close_case" not in answers:
            message = AIMessage(
                content="", tool_calls=[call("close_case", {"case_id": plan["case"]})]
            )
        elif answers["close_case"].get("kind") != "confirmed":
            message = AIMessage(content=f"The close is not confirmed: {answers['close_case']}")
        elif "update_case" not in answers or "email_owner" not in answers:
            wording = uuid.uuid4().hex[:8]  # a re-asked model words its email anew
            message = AIMessage(
                content="",
                tool_calls=[
                    call(
                        "update_case",
                        {
                            "case_id": plan["case"],
                            "priority": "high",
                            "note": f"escalated ({wording})",
                        },
                    ),
                    call(
                        "email_owner",
                        {
                            "to": plan["owner"],
                            "subject": f"{plan['case']} is closed",
                            "text": f"Your case is closed. Welcome aboard! [{wording}]",
                        },
                    ),
                ],
            )
        else:
            message = AIMessage(content="Done: " + json.dumps(answers, sort_keys=True))
        return ChatResult(generations=[ChatGeneration(message=message)])


def tools(effects: Effects) -> list[Any]:
    def grant(config: RunnableConfig) -> str:
        return str((config.get("configurable") or {}).get("grant") or GRANT)

    return [
        effect_tool(
            effects,
            name="close_case",
            description="Close a CRM case.",
            args_schema=CaseArgs,
            tenant=TENANT,
            action=f"{CRM}.close_case.v1",
            authorization_ref=grant,
            effect_of=lambda a: (a["case_id"], {"note": "closed by the agent"}),
            wait=WAIT_S,
        ),
        effect_tool(
            effects,
            name="update_case",
            description="Set a CRM case's priority.",
            args_schema=UpdateArgs,
            tenant=TENANT,
            action=f"{CRM}.update_case.v1",
            authorization_ref=grant,
            effect_of=lambda a: (
                a["case_id"],
                {"fields": {"priority": a["priority"]}, "note": a.get("note", "")},
            ),
            wait=WAIT_S,
        ),
        effect_tool(
            effects,
            name="email_owner",
            description="Email the case's owner.",
            args_schema=EmailArgs,
            tenant=TENANT,
            action="email.send.v1",
            authorization_ref=grant,
            effect_of=lambda a: (
                a["to"],
                {"to": a["to"], "subject": a["subject"], "text": a["text"]},
            ),
            wait=WAIT_S,
        ),
    ]


def build(kind: str, effects: Effects, saver: PostgresSaver) -> Any:
    model = ReAskingModel()
    if kind == "react":
        return create_react_agent(model, tools(effects), checkpointer=saver)
    node = ToolNode(tools(effects))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def _plan(case: str, owner: str) -> HumanMessage:
    return HumanMessage(content=json.dumps({"case": case, "owner": owner}), id=PLAN_ID)


def _dump(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    out = []
    for m in messages:
        entry: dict[str, Any] = {"type": m.type, "content": m.content}
        if isinstance(m, AIMessage):
            entry["tool_calls"] = [{"id": c["id"], "name": c["name"]} for c in m.tool_calls]
        if isinstance(m, ToolMessage):
            entry["name"], entry["status"] = m.name, m.status
        out.append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["run", "resume", "travel", "fork"])
    parser.add_argument("--thread", required=True)
    parser.add_argument("--case", default="case-1")
    parser.add_argument("--owner", default="owner@acme.test")
    parser.add_argument("--graph", choices=["react", "toolnode"], default="toolnode")
    parser.add_argument("--durability", choices=["sync", "async", "exit"], default="sync")
    parser.add_argument("--to", choices=["first-turn", "first-tools"], default="first-turn")
    parser.add_argument("--grant", default=GRANT)
    args = parser.parse_args(argv)

    ledger = runtime().ledger
    url = make_url(ledger.engine.url).set(drivername="postgresql")
    with PostgresSaver.from_conn_string(url.render_as_string(hide_password=False)) as saver:
        saver.setup()
        graph = build(args.graph, Effects(ledger), saver)
        config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
        options = {"durability": args.durability}
        if args.command == "run":
            graph.invoke({"messages": [_plan(args.case, args.owner)]}, config, **options)
        elif args.command == "resume":
            graph.invoke(None, config, **options)
        elif args.command == "travel":
            history = list(graph.get_state_history(config))[::-1]  # oldest first
            if args.to == "first-turn":  # before the model's first answer
                past = next(s for s in history if s.next == ("agent",))
            else:  # after the first AI message, before its tool calls ran
                past = next(s for s in history if s.next == ("tools",))
            graph.invoke(None, past.config, **options)
        else:  # fork before the first turn with another owner, under the grant given now
            history = list(graph.get_state_history(config))[::-1]
            past = next(s for s in history if s.next == ("agent",))
            plan = json.loads(str(past.values["messages"][0].content))
            forked = graph.update_state(
                past.config, {"messages": [_plan(plan["case"], args.owner)]}
            )
            forked = {**forked, "configurable": {**forked["configurable"], "grant": args.grant}}
            graph.invoke(None, forked, **options)
        state = graph.get_state(config)
        print(json.dumps({"next": list(state.next), "messages": _dump(state.values["messages"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
