"""The onboarding agent as a ReAct LangGraph agent: close case-318, then — once the close
is confirmed — tag the case as onboarded and email its owner, in one turn.

Built the way LangGraph agents are built: an agent node calls a chat model, `ToolNode`
runs its tool calls (in parallel threads), `tools_condition` loops back, and the thread is
checkpointed by `langgraph-checkpoint-postgres` in the ledger's own Postgres
(`--graph react` builds the same agent with `create_react_agent`). The tools are opledger
effects (`effect_tool`), each keyed by the act it asks for — the thread, the action, the
target and the action's intent fields — never by the tool call's id. So resuming after a
crash, time travel, a replay or a fork never repeats an effect, although the model is
asked again and gives its tool calls new ids.

The chat model here is a stand-in (`OnboardingModel`: no network) that behaves like a
real one where it matters: every time it is asked it invents **new tool-call ids** and
words its email anew. Put any LangChain chat model in its place (`make_graph(model=...)`).
It needs `pip install 'opledger[langgraph]'`, the ledger migrated, a broker and a worker
running (`opledger worker`). It is installed with opledger (`opledger example
langgraph_onboarding` writes a copy of this file):

    python -m opledger.examples.langgraph_onboarding run    --thread t1 [--case case-318]
    python -m opledger.examples.langgraph_onboarding resume --thread t1      # after a crash
    python -m opledger.examples.langgraph_onboarding travel --thread t1 --to first-turn
    python -m opledger.examples.langgraph_onboarding travel --thread t1 --to first-tools
    python -m opledger.examples.langgraph_onboarding fork   --thread t1 --owner new@acme.test \\
        --authorization auth_onboarding_fork
    python -m opledger.examples.langgraph_onboarding show   --thread t1

`run` grants `auth_onboarding` (crm.*, email.*) if it does not exist; `fork` grants the
authorization it names the same way (a grant that exists is used as it stands, revoked
or not). Each command prints the thread as one JSON line: `next`, and every message (each
tool's answer is the effect's result as JSON: kind, operation, receipt, `asked_before`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from pydantic import BaseModel, Field
from sqlalchemy.engine import make_url

from opledger.agents import Effects
from opledger.agents.langgraph import effect_tool
from opledger.ledger import Ledger, UnknownAuthorization
from opledger.tasks.app import runtime

TENANT = "acme"
GRANT = "auth_onboarding"
#: the human message's id: a fork replaces the message (another owner) under this id
BRIEF_ID = "brief"
#: how long a tool waits for its effect to settle before it answers what it waits for
WAIT_S = float(os.environ.get("ONBOARDING_WAIT_S", "30"))


class CloseCase(BaseModel):
    case_id: str = Field(description="The CRM case to close")


class TagCase(BaseModel):
    case_id: str
    stage: str = Field(description="The onboarding stage to set on the case")
    note: str = Field(default="", description="A note for the case's history")


class EmailOwner(BaseModel):
    to: str = Field(description="The owner's email address")
    subject: str
    text: str


def tools(effects: Effects) -> list[Any]:
    """The agent's tools. Each call is an opledger effect in the thread's run; its intent
    is the action, the target and the action's intent fields (for `crm.update_case.v1`,
    the `fields` it sets: a note is wording). The grant is the run's (`configurable.grant`,
    so a fork can run under its own), else `auth_onboarding`."""

    def grant(config: RunnableConfig) -> str:
        return str((config.get("configurable") or {}).get("grant") or GRANT)

    return [
        effect_tool(
            effects,
            name="close_case",
            description="Close a CRM case.",
            args_schema=CloseCase,
            tenant=TENANT,
            action="crm.close_case.v1",
            authorization_ref=grant,
            effect_of=lambda a: (a["case_id"], {"note": "closed by the onboarding agent"}),
            wait=WAIT_S,
        ),
        effect_tool(
            effects,
            name="tag_case",
            description="Set the onboarding stage of a CRM case.",
            args_schema=TagCase,
            tenant=TENANT,
            action="crm.update_case.v1",
            authorization_ref=grant,
            effect_of=lambda a: (
                a["case_id"],
                {"fields": {"stage": a["stage"]}, "note": a["note"]},
            ),
            wait=WAIT_S,
        ),
        effect_tool(
            effects,
            name="email_owner",
            description="Email the owner of a case.",
            args_schema=EmailOwner,
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


class OnboardingModel(BaseChatModel):
    """A stand-in chat model with the plan of the story, read from the conversation: close
    the case; once the close is confirmed, tag the case and email its owner (two tool calls
    in one message); then answer. Like a real model asked again, it gives its tool calls
    new random ids every time and words the email anew."""

    @property
    def _llm_type(self) -> str:
        return "onboarding-stand-in"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> OnboardingModel:  # type: ignore[override]
        return self  # the plan knows the tools

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        brief = json.loads(str(next(m for m in messages if isinstance(m, HumanMessage)).content))
        answers = {
            str(m.name): json.loads(str(m.content)) for m in messages if isinstance(m, ToolMessage)
        }

        def call(name: str, **args: Any) -> dict[str, Any]:
            return {
                "id": f"call_{uuid.uuid4().hex}",
                "name": name,
                "args": args,
                "type": "tool_call",
            }

        case, owner = brief["case"], brief["owner"]
        if "close_case" not in answers:
            message = AIMessage(content="", tool_calls=[call("close_case", case_id=case)])
        elif answers["close_case"]["kind"] != "confirmed":
            message = AIMessage(content=f"Stopped: {answers['close_case']['message']}")
        elif "tag_case" not in answers or "email_owner" not in answers:
            wording = uuid.uuid4().hex[:6]  # asked again, a model words it anew
            message = AIMessage(
                content="",
                tool_calls=[
                    call("tag_case", case_id=case, stage="onboarded", note=f"done ({wording})"),
                    call(
                        "email_owner",
                        to=owner,
                        subject=f"{case} is closed",
                        text=f"Your onboarding case is closed. Welcome aboard! ({wording})",
                    ),
                ],
            )
        else:
            message = AIMessage(content="Done: " + json.dumps(answers, sort_keys=True))
        return ChatResult(generations=[ChatGeneration(message=message)])


def make_graph(
    effects: Effects,
    checkpointer: PostgresSaver,
    *,
    model: BaseChatModel | None = None,
    kind: str = "toolnode",
) -> Any:
    """The ReAct agent: hand-built around `ToolNode` and `tools_condition`, or
    `create_react_agent` (`kind="react"`); the same nodes, "agent" and "tools"."""
    model = model or OnboardingModel()
    if kind == "react":
        return create_react_agent(model, tools(effects), checkpointer=checkpointer)
    bound = model.bind_tools(tools(effects))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [bound.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools(effects)))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


@contextmanager
def checkpointer(ledger: Ledger) -> Iterator[PostgresSaver]:
    """LangGraph's Postgres checkpointer, in the ledger's own database."""
    url = make_url(ledger.engine.url).set(drivername="postgresql")
    with PostgresSaver.from_conn_string(url.render_as_string(hide_password=False)) as saver:
        saver.setup()
        yield saver


def brief(case: str, owner: str) -> HumanMessage:
    return HumanMessage(content=json.dumps({"case": case, "owner": owner}), id=BRIEF_ID)


def ensure_grant(ledger: Ledger, ref: str, by: str) -> None:
    try:
        ledger.authorization(ref)
    except UnknownAuthorization:
        ledger.grant(tenant=TENANT, scope=["crm.*", "email.*"], granted_by=by, ref=ref)


def _past(graph: Any, config: RunnableConfig, next_node: str) -> Any:
    """The thread's oldest checkpoint whose next node is `next_node`."""
    history = list(graph.get_state_history(config))[::-1]
    return next(s for s in history if s.next == (next_node,))


def _print(graph: Any, config: RunnableConfig) -> None:
    snapshot = graph.get_state(config)
    messages = []
    for m in snapshot.values.get("messages", []):
        entry: dict[str, Any] = {"type": m.type, "content": m.content}
        if isinstance(m, AIMessage):
            entry["tool_calls"] = [{"id": c["id"], "name": c["name"]} for c in m.tool_calls]
        if isinstance(m, ToolMessage):
            entry["name"], entry["status"] = m.name, m.status
        messages.append(entry)
    print(json.dumps({"next": list(snapshot.next), "messages": messages}), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "resume", "travel", "fork", "show"):
        p = sub.add_parser(name)
        p.add_argument("--thread", required=True)
        p.add_argument("--graph", choices=["toolnode", "react"], default="toolnode")
        # LangGraph's default, "async", writes checkpoints in the background; "exit" only
        # when the run ends (a process killed mid-run then left nothing: run it again)
        p.add_argument("--durability", choices=["sync", "async", "exit"], default="sync")
        if name == "run":
            p.add_argument("--case", default="case-318")
            p.add_argument("--owner", default="owner@acme.test")
        if name == "travel":
            p.add_argument(
                "--to",
                choices=["first-turn", "first-tools"],
                default="first-turn",
                help="before the model's first turn, or between its first message and tools",
            )
        if name == "fork":
            p.add_argument("--owner", required=True)
            p.add_argument("--authorization", required=True)
    args = parser.parse_args(argv)
    ledger = runtime().ledger  # OPLEDGER_DATABASE_URL, with the configured adapters
    config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
    options = {"durability": args.durability}
    with checkpointer(ledger) as saver:
        graph = make_graph(Effects(ledger), saver, kind=args.graph)
        if args.command == "run":
            ensure_grant(ledger, GRANT, "alice")
            graph.invoke({"messages": [brief(args.case, args.owner)]}, config, **options)
        elif args.command == "resume":  # the node that was running when it died runs again
            graph.invoke(None, config, **options)
        elif args.command == "travel":  # every node after that checkpoint runs again
            next_node = "agent" if args.to == "first-turn" else "tools"
            graph.invoke(None, _past(graph, config, next_node).config, **options)
        elif args.command == "fork":  # from before the first turn, another owner
            ensure_grant(ledger, args.authorization, "bob")
            past = _past(graph, config, "agent")
            case = json.loads(str(past.values["messages"][0].content))["case"]
            forked = graph.update_state(past.config, {"messages": [brief(case, args.owner)]})
            configurable = {**forked["configurable"], "grant": args.authorization}
            graph.invoke(None, {**forked, "configurable": configurable}, **options)
        _print(graph, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
