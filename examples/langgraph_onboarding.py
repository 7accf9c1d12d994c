"""The onboarding agent as a LangGraph graph: close case-318, then — only once the close is
confirmed — email the account owner. Every side effect is an opledger effect keyed by the
thread, the node and the tool call, so resuming, replaying or forking the thread never
repeats one.

The nodes are deterministic (the "model" is a function of the state: no LLM, no network
but the providers'), and the graph is checkpointed by `langgraph-checkpoint-postgres` in
the ledger's own Postgres. It needs `pip install 'opledger[langgraph]'`, the ledger
migrated, a broker, and a worker running (`opledger worker`):

    python examples/langgraph_onboarding.py run    --thread t1
    python examples/langgraph_onboarding.py resume --thread t1     # after a crash
    python examples/langgraph_onboarding.py replay --thread t1 --before close
    python examples/langgraph_onboarding.py fork   --thread t1 --owner new@acme.test \\
        --authorization auth_onboarding_fork
    python examples/langgraph_onboarding.py show   --thread t1

Each command prints the thread's state as one JSON line: every tool call's operation and
how it ended.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import operator
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from sqlalchemy.engine import make_url

from opledger.agents import Effects
from opledger.agents.langgraph import describe, node_effect
from opledger.tasks.app import runtime

TENANT = "acme"
#: how long a node waits for its effect to settle before it reports what it waits for
WAIT_S = float(os.environ.get("ONBOARDING_WAIT_S", "30"))


def _merge(left: dict[str, Any], right: dict[str, Any]) -> dict[str, Any]:
    return {**left, **right}


class Onboarding(TypedDict, total=False):
    case_id: str
    owner_email: str
    close_authorization: str
    email_authorization: str
    #: what the "model" asked for: LangChain-style tool calls ({"id", "name", "args"})
    tool_calls: list[dict[str, Any]]
    #: tool call id -> the effect's result (kind, op_id, receipt or reason)
    results: Annotated[dict[str, dict[str, Any]], _merge]
    log: Annotated[list[str], operator.add]


def _tool_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A deterministic stand-in for a model's tool call: the same request, the same id."""
    digest = hashlib.sha256(json.dumps([name, args], sort_keys=True).encode()).hexdigest()
    return {"id": f"call_{digest[:16]}", "name": name, "args": args}


def plan(state: Onboarding) -> dict[str, Any]:
    """The "model": close the case, then email its owner."""
    close = _tool_call("close_case", {"case_id": state["case_id"], "note": "onboarding done"})
    email = _tool_call(
        "email_owner",
        {
            "to": state["owner_email"],
            "subject": f"{state['case_id']} is closed",
            "text": "Your onboarding case is closed. Welcome aboard!",
        },
    )
    return {"tool_calls": [close, email], "log": ["plan"]}


def _call(state: Onboarding, name: str) -> dict[str, Any]:
    return next(c for c in state["tool_calls"] if c["name"] == name)


def make_graph(effects: Effects, checkpointer: PostgresSaver) -> Any:
    def close(state: Onboarding, config: RunnableConfig) -> dict[str, Any]:
        call = _call(state, "close_case")
        result = node_effect(
            effects,
            config,
            call,
            tenant=TENANT,
            action="crm.close_case.v1",
            target=call["args"]["case_id"],
            payload={"note": call["args"]["note"]},
            authorization_ref=state["close_authorization"],
            wait=WAIT_S,
        )
        return {"results": {call["id"]: json.loads(describe(result))}, "log": ["close"]}

    def email(state: Onboarding, config: RunnableConfig) -> dict[str, Any]:
        call = _call(state, "email_owner")
        closed = state["results"][_call(state, "close_case")["id"]]
        result = node_effect(
            effects,
            config,
            call,
            tenant=TENANT,
            action="email.send.v1",
            target=call["args"]["to"],
            payload=call["args"],
            authorization_ref=state["email_authorization"],
            after=[closed["op_id"]],  # the ledger holds it until the close is confirmed
            wait=WAIT_S,
        )
        return {"results": {call["id"]: json.loads(describe(result))}, "log": ["email"]}

    def after_close(state: Onboarding) -> str:
        closed = state["results"][_call(state, "close_case")["id"]]
        return "email" if closed["kind"] == "confirmed" else END

    graph = StateGraph(Onboarding)
    graph.add_node("plan", plan)
    graph.add_node("close", close)
    graph.add_node("email", email)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "close")
    graph.add_conditional_edges("close", after_close, ["email", END])
    graph.add_edge("email", END)
    return graph.compile(checkpointer=checkpointer)


@contextmanager
def onboarding() -> Iterator[tuple[Any, Effects]]:
    """The graph, checkpointed in the ledger's database, and the effects it causes."""
    ledger = runtime().ledger  # OPLEDGER_DATABASE_URL, with the configured adapters
    url = make_url(ledger.engine.url).set(drivername="postgresql")
    with PostgresSaver.from_conn_string(url.render_as_string(hide_password=False)) as saver:
        saver.setup()
        effects = Effects(ledger)
        yield make_graph(effects, saver), effects


#: every checkpoint written before the next step starts (LangGraph's default, "async",
#: writes them in the background: a process killed mid-run may lose the last ones, and
#: a resume then starts earlier — harmless for the effects here, but a longer replay)
DURABILITY = "sync"


def _config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread}}


def _print(graph: Any, config: RunnableConfig) -> None:
    snapshot = graph.get_state(config)
    values = snapshot.values
    print(
        json.dumps(
            {
                "next": list(snapshot.next),
                "owner_email": values.get("owner_email"),
                "tool_calls": values.get("tool_calls", []),
                "results": values.get("results", {}),
                "log": values.get("log", []),
            },
            sort_keys=True,
        ),
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "resume", "replay", "fork", "show"):
        p = sub.add_parser(name)
        p.add_argument("--thread", required=True)
        if name == "run":
            p.add_argument("--case", default="case-318")
            p.add_argument("--owner", default="owner@acme.test")
        if name == "replay":
            p.add_argument("--before", default="close", help="replay from before this node")
        if name == "fork":
            p.add_argument("--owner", required=True)
            p.add_argument("--authorization", required=True)
    args = parser.parse_args(argv)
    config = _config(args.thread)
    with onboarding() as (graph, effects):
        ledger = effects.ledger
        if args.command == "run":
            grant = ledger.grant(
                tenant=TENANT, scope=["crm.*", "email.*"], granted_by="alice", ref="auth_onboarding"
            )
            start = {
                "case_id": args.case,
                "owner_email": args.owner,
                "close_authorization": grant.ref,
                "email_authorization": grant.ref,
            }
            graph.invoke(start, config, durability=DURABILITY)
        elif args.command == "resume":  # the node that was running when it died runs again
            graph.invoke(None, config, durability=DURABILITY)
        elif args.command == "replay":  # time travel: every node after that checkpoint reruns
            past = next(s for s in graph.get_state_history(config) if s.next == (args.before,))
            graph.invoke(None, past.config, durability=DURABILITY)
        elif args.command == "fork":  # another recipient: a new tool call, a new intent
            grant = ledger.grant(
                tenant=TENANT, scope=["email.*"], granted_by="bob", ref=args.authorization
            )
            past = next(s for s in graph.get_state_history(config) if s.next == ("plan",))
            forked = graph.update_state(
                past.config, {"owner_email": args.owner, "email_authorization": grant.ref}
            )
            graph.invoke(None, forked, durability=DURABILITY)
        _print(graph, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
