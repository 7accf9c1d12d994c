"""The support agent on the OpenAI Agents SDK: each act once, whatever the model asks again.

It closes a case, then — once the close is confirmed — tags the case as onboarded and
emails its owner, in one turn.

Built the way Agents SDK agents are built: an `Agent` with function tools, `Runner.run`
with a session that keeps the conversation (`SQLAlchemySession`, in the ledger's own
Postgres), and a `RunState` for a call a person approves first (`--approval`). The tools are
opledger effects (`opledger.agents.openai_agents.effect_tool`), each keyed by the act it
asks for — the session, the action, the target and the action's intent fields — never by
the call's id. So running the session again after a crash, a retry that takes back the
model's turns (`session.pop_item()`), or an approved run resumed twice never repeats an
effect, although the model is asked again and gives its tool calls new ids.

The model here is a stand-in (`SupportModel`: no network) that behaves like a real one
where it matters: every time it is asked it invents **new call ids** and words its note and
its email anew. Put a real model in its place with `--model gpt-4.1` (and
`OPENAI_API_KEY`), or `make_agent(model=...)`. With the stand-in the SDK's tracing is off
(its exporter would send traces to OpenAI). It needs `pip install 'opledger[openai-agents]'`,
the ledger migrated, a broker and a worker running (`opledger worker`):

    python -m opledger.examples.openai_agents_support run    --session s1 [--case case-318]
    python -m opledger.examples.openai_agents_support resume --session s1   # after a crash
    python -m opledger.examples.openai_agents_support retry  --session s1   # asked again
    python -m opledger.examples.openai_agents_support run    --session s2 --approval \\
        --state s2.json                          # stops for a person to approve the close
    python -m opledger.examples.openai_agents_support approve --session s2 --state s2.json
    python -m opledger.examples.openai_agents_support show   --session s1

(`python examples/openai_agents_support.py ...` from a checkout.) `run` grants
`auth_support` (crm.*, email.*) if it does not exist. Each command prints the session as
one JSON line: the final output, the approvals the run waits for, and every item (each
tool's output is the effect's result as JSON: kind, operation, receipt, `asked_before`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agents import (
    Agent,
    ModelResponse,
    RunResult,
    RunState,
    Usage,
    set_tracing_disabled,
)
from agents.extensions.memory import SQLAlchemySession
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic import BaseModel, Field
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from opledger.agents import Effects
from opledger.agents.openai_agents import effect_tool, run_agent
from opledger.ledger import Ledger, UnknownAuthorization
from opledger.tasks.app import runtime

TENANT = "acme"
GRANT = "auth_support"
#: how long a tool waits for its effect to settle before it answers what it waits for
WAIT_S = float(os.environ.get("SUPPORT_WAIT_S", "30"))


class CloseCase(BaseModel):
    case_id: str = Field(description="The CRM case to close")


class TagCase(BaseModel):
    case_id: str
    stage: str = Field(description="The onboarding stage to set on the case")
    note: str = Field(description="A note for the case's history")


class EmailOwner(BaseModel):
    to: str = Field(description="The owner's email address")
    subject: str
    text: str


def tools(effects: Effects, *, approval: bool = False) -> list[Any]:
    """The agent's tools. Each call is an opledger effect in the session's run; its intent
    is the action, the target and the action's intent fields (for `crm.update_case.v1`, the
    `fields` it sets: a note is wording). With `approval`, closing a case waits for a
    person's approval (the SDK's `needs_approval`)."""
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
            needs_approval=approval,
        ),
        effect_tool(
            effects,
            name="tag_case",
            description="Set the onboarding stage of a CRM case.",
            args_schema=TagCase,
            tenant=TENANT,
            action="crm.update_case.v1",
            authorization_ref=GRANT,
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
            authorization_ref=GRANT,
            effect_of=lambda a: (
                a["to"],
                {"to": a["to"], "subject": a["subject"], "text": a["text"]},
            ),
            wait=WAIT_S,
        ),
    ]


class SupportModel(Model):
    """A stand-in model with the plan of the story, read from the conversation: close the
    case; once the close is confirmed, tag the case and email its owner (two tool calls in
    one response); then answer. Like a real model asked again, it gives its tool calls new
    random ids every time and words the note and the email anew."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        return ModelResponse(output=self.plan(items), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the stand-in model does not stream")

    def plan(self, items: list[Any]) -> list[Any]:
        brief = json.loads(next(i["content"] for i in items if i.get("role") == "user"))
        names = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
        answers = {
            names[i["call_id"]]: json.loads(i["output"])
            for i in items
            if i.get("type") == "function_call_output" and i["call_id"] in names
        }
        case, owner = brief["case"], brief["owner"]
        if "close_case" not in answers:
            return [_call("close_case", case_id=case)]
        if answers["close_case"].get("kind") != "confirmed":
            return [_say(f"Stopped: {answers['close_case'].get('message')}")]
        if "tag_case" not in answers or "email_owner" not in answers:
            wording = uuid.uuid4().hex[:6]  # asked again, a model words it anew
            return [
                _call("tag_case", case_id=case, stage="onboarded", note=f"done ({wording})"),
                _call(
                    "email_owner",
                    to=owner,
                    subject=f"{case} is closed",
                    text=f"Your onboarding case is closed. Welcome aboard! ({wording})",
                ),
            ]
        return [_say("Done: " + json.dumps(answers, sort_keys=True))]


def _call(name: str, **args: Any) -> ResponseFunctionToolCall:
    """A tool call under a new id, its arguments as a strict schema has them (every field,
    `repeat` null)."""
    call_id = f"call_{uuid.uuid4().hex}"
    arguments = json.dumps({**args, "repeat": None})
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", call_id=call_id, name=name, arguments=arguments, type="function_call"
    )


def _say(text: str) -> ResponseOutputMessage:
    content = ResponseOutputText(text=text, type="output_text", annotations=[])
    return ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex}",
        type="message",
        role="assistant",
        status="completed",
        content=[content],
    )


def make_agent(
    effects: Effects, *, model: Model | str | None = None, approval: bool = False
) -> Agent[Any]:
    """The support agent: the stand-in model unless you give one (a `Model`, or a model's
    name with `OPENAI_API_KEY` set)."""
    if model is None:
        set_tracing_disabled(True)  # no network: the SDK's exporter would reach OpenAI
    return Agent(
        name="support",
        instructions=(
            "You handle a support case given as JSON (case, owner). Close the case. Once the "
            "close is confirmed, tag the case with stage 'onboarded' and email the owner that "
            "the case is closed, in one turn. Then say what you did."
        ),
        model=model or SupportModel(),
        tools=tools(effects, approval=approval),
    )


@asynccontextmanager
async def session_of(ledger: Ledger, session_id: str) -> AsyncIterator[SQLAlchemySession]:
    """The conversation's session, in the ledger's own Postgres (its own tables)."""
    url = make_url(ledger.engine.url).set(drivername="postgresql+psycopg")
    engine = create_async_engine(url)
    try:
        yield SQLAlchemySession(session_id, engine=engine, create_tables=True)
    finally:
        await engine.dispose()


def brief(case: str, owner: str) -> str:
    return json.dumps({"case": case, "owner": owner})


def ensure_grant(ledger: Ledger, ref: str, by: str) -> None:
    try:
        ledger.authorization(ref)
    except UnknownAuthorization:
        ledger.grant(tenant=TENANT, scope=["crm.*", "email.*"], granted_by=by, ref=ref)


async def rewind(session: SQLAlchemySession) -> None:
    """Take back every turn after the user's first message (`pop_item`, the SDK's way to
    correct a conversation): the model is asked again for all of it."""
    while len(await session.get_items()) > 1:
        await session.pop_item()


def _item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type") or "message"
    entry: dict[str, Any] = {"type": kind}
    if kind == "function_call":
        entry.update(name=item["name"], call_id=item["call_id"])
    elif kind == "function_call_output":
        entry.update(call_id=item["call_id"], output=json.loads(item["output"]))
    else:
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(c.get("text", "")) for c in content)
        entry.update(role=item.get("role"), content=content)
    return entry


async def _print(session: SQLAlchemySession, result: RunResult | None) -> None:
    state = {
        "final_output": result.final_output if result is not None else None,
        "interruptions": [i.tool_name for i in result.interruptions] if result else [],
        "items": [_item(dict(i)) for i in await session.get_items()],
    }
    print(json.dumps(state, default=str), flush=True)


async def command(args: argparse.Namespace) -> None:
    ledger = runtime().ledger  # OPLEDGER_DATABASE_URL, with the configured adapters
    agent = make_agent(Effects(ledger), model=args.model, approval=args.approval)
    async with session_of(ledger, args.session) as session:
        result: RunResult | None = None
        if args.command == "run":
            ensure_grant(ledger, GRANT, "alice")
            result = await run_agent(agent, brief(args.case, args.owner), session=session)
        elif args.command == "resume":  # the model is asked again from the session's history
            result = await run_agent(agent, [], session=session)
        elif args.command == "retry":  # its turns taken back: asked again for all of them
            await rewind(session)
            result = await run_agent(agent, [], session=session)
        elif args.command == "approve":  # a person approves what the saved run waits for
            state = await RunState.from_string(agent, Path(args.state).read_text())
            for item in state.get_interruptions():
                state.approve(item)
            result = await run_agent(agent, state, session=session)
        if result is not None and result.interruptions and args.state:
            Path(args.state).write_text(result.to_state().to_string())
        await _print(session, result)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "resume", "retry", "approve", "show"):
        p = sub.add_parser(name)
        p.add_argument("--session", required=True, help="the conversation's session id")
        p.add_argument("--model", default=None, help="a model's name (else the stand-in)")
        p.add_argument(
            "--approval", action="store_true", help="closing a case needs a person's approval"
        )
        p.add_argument(
            "--state", required=name == "approve", help="where a run waiting for approval is kept"
        )
        if name == "run":
            p.add_argument("--case", default="case-318")
            p.add_argument("--owner", default="owner@acme.test")
    args = parser.parse_args(argv)
    if args.command == "approve":
        args.approval = True  # the agent the saved run was made with
    asyncio.run(command(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
