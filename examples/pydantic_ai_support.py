"""A support agent on Pydantic AI: close a customer's CRM case, then — once the close is
confirmed — record the resolution on the case and email the customer, in one turn.

The tools are opledger effects (`opledger.agents.pydantic_ai.effect_tool`), each keyed by
the act it asks for — the run, the action, the target and the action's intent fields —
never by the tool call's id. The run is the ticket the agent works on (`support:<ticket>`,
named from the agent's deps), or, with `--dbos`, the DBOS workflow the agent runs in
(`dbos:support-<ticket>`: `DBOSDurability`). So running the agent again after a crash
never repeats an effect, although the model is asked again and gives its tool calls new
ids; a DBOS workflow recovered after a crash replays its model steps and runs the
interrupted tool again, which answers with the recorded operation.

The model here is a stand-in (`SupportModel`, a Pydantic AI `FunctionModel`: no network)
that behaves like a real one where it matters: every time it is asked it invents **new
tool-call ids** and words its note and email anew. Give a real one with `--model` (any
model name Pydantic AI knows, `openai:gpt-5.2` say, its provider's package and key
installed) or `SUPPORT_MODEL`. It needs `pip install 'opledger[pydantic-ai]'`, the ledger
migrated, a broker and a worker running (`opledger worker`):

    python -m opledger.examples.pydantic_ai_support run    --ticket t1 [--case case-318]
    python -m opledger.examples.pydantic_ai_support resume --ticket t1   # after a crash
    python -m opledger.examples.pydantic_ai_support run    --ticket t2 --dbos
    python -m opledger.examples.pydantic_ai_support resume --ticket t2 --dbos

(`python examples/pydantic_ai_support.py ...` from a checkout.) Pydantic AI keeps nothing of
a run, so `resume` runs the agent again from the start with the same ticket (give it the
same `--case` and `--customer`); with `--dbos` it launches DBOS, which recovers the
ticket's workflow where it was, and waits for it. DBOS keeps its workflows in
`DBOS_SYSTEM_DATABASE_URL` (default: the ledger's database, in DBOS's own schema). `run`
grants `auth_support` (crm.*, email.*) if it does not exist. Each command prints the run as
one JSON line: the run's output, and every tool call with its id and the answer the model
read (the effect's result: kind, operation, receipt, `asked_before`, `differs`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy.engine import make_url

from opledger.agents import Effects
from opledger.agents.pydantic_ai import RunOf, effect_tool
from opledger.ledger import Ledger, UnknownAuthorization
from opledger.tasks.app import runtime

TENANT = "acme"
GRANT = "auth_support"
#: how long a tool waits for its effect to settle before it answers what it waits for
WAIT_S = float(os.environ.get("SUPPORT_WAIT_S", "30"))
#: the agent's name: DBOS names its steps and workflows after it
NAME = "support"


@dataclass
class Ticket:
    """The agent's deps: the ticket it works on."""

    ticket: str
    case: str
    customer: str


class CloseCase(BaseModel):
    case_id: str = Field(description="The CRM case to close")


class RecordResolution(BaseModel):
    case_id: str
    resolution: str = Field(description="How the case was resolved, one word")
    note: str = Field(default="", description="A note for the case's history")


class EmailCustomer(BaseModel):
    to: str = Field(description="The customer's email address")
    subject: str
    text: str


def ticket_run(ctx: RunContext[Ticket]) -> str:
    """The run, without a durable workflow: the ticket."""
    return f"support:{ctx.deps.ticket}"


def tools(effects: Effects, run: RunOf | None) -> list[Any]:
    """The agent's tools, each call an opledger effect in `run` (None: the DBOS
    workflow's). For `crm.update_case.v1` the intent is the `fields` it sets: a note is
    wording, and so is an email's text."""
    return [
        effect_tool(
            effects,
            name="close_case",
            description="Close a CRM case.",
            args_schema=CloseCase,
            tenant=TENANT,
            action="crm.close_case.v1",
            authorization_ref=GRANT,
            effect_of=lambda a: (a["case_id"], {"note": "closed by the support agent"}),
            wait=WAIT_S,
            run=run,
        ),
        effect_tool(
            effects,
            name="record_resolution",
            description="Record how a CRM case was resolved.",
            args_schema=RecordResolution,
            tenant=TENANT,
            action="crm.update_case.v1",
            authorization_ref=GRANT,
            effect_of=lambda a: (
                a["case_id"],
                {"fields": {"resolution": a["resolution"]}, "note": a["note"]},
            ),
            wait=WAIT_S,
            run=run,
        ),
        effect_tool(
            effects,
            name="email_customer",
            description="Email the customer of a case.",
            args_schema=EmailCustomer,
            tenant=TENANT,
            action="email.send.v1",
            authorization_ref=GRANT,
            effect_of=lambda a: (
                a["to"],
                {"to": a["to"], "subject": a["subject"], "text": a["text"]},
            ),
            wait=WAIT_S,
            run=run,
        ),
    ]


def _answer(part: ToolReturnPart) -> dict[str, Any]:
    """A tool's answer as the model read it: the effect's summary, or a refusal (JSON)."""
    content = part.content
    return cast(dict[str, Any], json.loads(content) if isinstance(content, str) else content)


def answers_of(messages: list[ModelMessage]) -> dict[str, dict[str, Any]]:
    """The tools' last answers by tool name."""
    return {
        part.tool_name: _answer(part)
        for message in messages
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def support_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A stand-in model with the plan of the story, read from the conversation: close the
    case; once the close is confirmed, record the resolution and email the customer (two
    tool calls in one response); then answer. Like a real model asked again, it gives its
    tool calls new random ids every time and words its note and email anew."""
    prompt = next(
        p
        for m in messages
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    )
    brief = json.loads(str(prompt.content))
    answers = answers_of(messages)

    def call(name: str, **args: Any) -> ToolCallPart:
        return ToolCallPart(name, args, tool_call_id=f"call_{uuid.uuid4().hex}")

    case, customer = brief["case"], brief["customer"]
    if "close_case" not in answers:
        return ModelResponse(parts=[call("close_case", case_id=case)])
    if answers["close_case"]["kind"] != "confirmed":
        return ModelResponse(parts=[TextPart(f"Stopped: {answers['close_case']['message']}")])
    if "record_resolution" not in answers or "email_customer" not in answers:
        wording = uuid.uuid4().hex[:6]  # asked again, a model words it anew
        return ModelResponse(
            parts=[
                call(
                    "record_resolution",
                    case_id=case,
                    resolution="resolved",
                    note=f"done ({wording})",
                ),
                call(
                    "email_customer",
                    to=customer,
                    subject=f"{case} is resolved",
                    text=f"Your case is resolved; thank you for your patience. ({wording})",
                ),
            ]
        )
    return ModelResponse(parts=[TextPart("Done: " + json.dumps(answers, sort_keys=True))])


def make_agent(effects: Effects, *, model: Any = None, dbos: bool = False) -> Agent[Ticket, str]:
    """The support agent; with `dbos`, durable under DBOS (`DBOSDurability`: run it inside
    a DBOS workflow), its effects in the workflow's run, else in the ticket's."""
    capabilities: list[Any] = []
    if dbos:
        from pydantic_ai.durable_exec.dbos import DBOSDurability

        capabilities.append(DBOSDurability())
    return Agent(
        model or FunctionModel(support_model),
        name=NAME,
        deps_type=Ticket,
        tools=tools(effects, None if dbos else ticket_run),
        capabilities=capabilities,
        instructions=(
            "You resolve support tickets: close the case; once it is closed, record the "
            "resolution and email the customer. The tools' answers say how each act stands."
        ),
    )


def report(result: Any) -> dict[str, Any]:
    """The run as printed: its output, and each tool call with its id and answer."""
    calls = [
        {"tool": p.tool_name, "id": p.tool_call_id, "outcome": p.outcome, "answer": _answer(p)}
        for message in result.all_messages()
        for p in message.parts
        if isinstance(p, ToolReturnPart)
    ]
    return {"output": result.output, "calls": calls}


def ensure_grant(ledger: Ledger) -> None:
    try:
        ledger.authorization(GRANT)
    except UnknownAuthorization:
        ledger.grant(tenant=TENANT, scope=["crm.*", "email.*"], granted_by="alice", ref=GRANT)


def brief(ticket: Ticket) -> str:
    return json.dumps({"case": ticket.case, "customer": ticket.customer})


def run_plain(agent: Agent[Ticket, str], ticket: Ticket) -> dict[str, Any]:
    """The agent run in this process, its effects in the ticket's run."""
    return report(agent.run_sync(brief(ticket), deps=ticket))


def run_dbos(
    agent: Agent[Ticket, str], ledger: Ledger, ticket: Ticket, resume: bool
) -> dict[str, Any]:
    """The agent run inside the DBOS workflow `support-<ticket>` (started, or with
    `resume` recovered by DBOS's launch), until it ends."""
    from dbos import DBOS, SetWorkflowID

    @DBOS.workflow(name=f"{NAME}.ticket")
    async def support(case: str, customer: str, ticket_id: str) -> dict[str, Any]:
        deps = Ticket(ticket_id, case, customer)
        return report(await agent.run(brief(deps), deps=deps))

    url = os.environ.get("DBOS_SYSTEM_DATABASE_URL") or make_url(ledger.engine.url).set(
        drivername="postgresql"
    ).render_as_string(hide_password=False)
    DBOS(
        config={
            "name": "opledger-support-example",
            "system_database_url": url,
            "log_level": "WARNING",
        }
    )
    DBOS.launch()  # recovers this executor's workflows that a crash left pending
    try:
        workflow_id = f"{NAME}-{ticket.ticket}"
        if resume:
            return cast(dict[str, Any], DBOS.retrieve_workflow(workflow_id).get_result())
        with SetWorkflowID(workflow_id):  # the same id again: its recorded result
            handle = DBOS.start_workflow(support, ticket.case, ticket.customer, ticket.ticket)
        return cast(dict[str, Any], handle.get_result())
    finally:
        DBOS.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "resume"):
        p = sub.add_parser(name)
        p.add_argument("--ticket", required=True)
        p.add_argument("--case", default="case-318")
        p.add_argument("--customer", default="customer@acme.test")
        p.add_argument("--dbos", action="store_true", help="run in a DBOS workflow")
        p.add_argument("--model", default=os.environ.get("SUPPORT_MODEL"))
    args = parser.parse_args(argv)
    ledger = runtime().ledger  # OPLEDGER_DATABASE_URL, with the configured adapters
    if args.command == "run":
        ensure_grant(ledger)
    agent = make_agent(Effects(ledger), model=args.model, dbos=args.dbos)
    ticket = Ticket(args.ticket, args.case, args.customer)
    if args.dbos:
        done = run_dbos(agent, ledger, ticket, resume=args.command == "resume")
    else:  # Pydantic AI keeps nothing of a run: resuming is running it again
        done = run_plain(agent, ticket)
    print(json.dumps({"ticket": args.ticket, **done}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
