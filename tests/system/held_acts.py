"""The rig of tests/system/test_approvals_flow.py: a deployment whose approval policy holds
large credits for a person, the agent that asks for them, the console its operators
decide in, and what the provider received.

The policy (`OPLEDGER_APPROVAL_POLICIES`, given to the workers and to the asking process
alike) asks one person about a credit above 10000 set on a case (`crm.update_case.v1`'s
`fields.credit`), two people above 100000. The provider is the sandbox CRM of the system
stack (its keyed-status account), whose ground truth counts every request it received by
idempotency key and every change it applied by case.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from pydantic import BaseModel

from opledger.adapters.registry import load_registry
from opledger.agents import EffectPending, EffectResult, Effects
from opledger.agents.langgraph import effect_tool
from opledger.dev.chaos.variants import KINDS
from opledger.dev.processes import Proc, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Operation, Status
from opledger.tasks.app import dispatch
from tests.conftest import truncate_all
from tests.consoles import add_operator, browser_sign_in, running_console

from .conftest import settings_of, settled, worker_with

if TYPE_CHECKING:  # Selenium is imported once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

CRM = KINDS[0]  # crm.*: keyed, with a status API (the sandbox's keyed-status account)
UPDATE = "crm.update_case.v1"
#: one person approves a credit above 10000, two above 100000 (the highest tier decides)
POLICIES = {
    UPDATE: [
        {"when": [{"field": "fields.credit", "above": 10000}]},
        {"when": [{"field": "fields.credit", "above": 100000}], "approvers": 2},
    ]
}
POLICY_ENV = {"OPLEDGER_APPROVAL_POLICIES": json.dumps(POLICIES)}
GRANT = "auth_acme"


@dataclass
class Desk:
    url: str  #: the console's
    env: dict[str, str]  #: the asking process's environment (the workers' and the policy)
    ledger: Ledger  #: the agent's ledger, under the policy
    effects: Effects  #: the agent's surface: publishes to the real workers
    sandbox: Sandbox
    worker: Proc


@contextmanager
def desk_on(
    stack: Stack, engine_of: Ledger, database_url: str, sandbox: Sandbox, state: Path
) -> Iterator[Desk]:
    """An empty ledger; the stack's worker replaced by one under the policy, and beat; a
    console where alice and bob approve acme's CRM acts (and so does an operator account
    named as the agents' actor, "agent": it must never approve what it asked); the agent's
    ledger (on `engine_of`'s engine) under the same policy."""
    truncate_all(database_url)
    sandbox.reset()
    env = {**stack.env, **POLICY_ENV}
    sandbox.configure(account=CRM.account, **CRM.sandbox_config(settings_of(env)))
    if stack.beat is None or stack.beat.proc.poll() is not None:
        stack.start_beat(wait=True)
    for name in ("alice", "bob", "agent"):
        add_operator(env, name, "--tenant", "acme", "--approves", "crm.*")
    registry = load_registry(settings_of(env))
    ledger = Ledger(engine_of.engine, actions=registry)
    ledger.grant(tenant="acme", scope=["crm.*"], granted_by="test", ref=GRANT)
    console_env = {**env, "OPLEDGER_STATE_DIR": str(state)}
    try:
        with (
            worker_with(stack, "w1", 2, **POLICY_ENV) as worker,
            running_console(console_env, state / "console.log", forked=True) as url,
        ):
            effects = Effects(ledger, publish=lambda op_id: dispatch.delay(op_id))
            yield Desk(url, env, ledger, effects, sandbox, worker)
    finally:
        registry.close()
        truncate_all(database_url)  # no act left held for the next test's worker


# -- asking, as an agent does ---------------------------------------------------------------


def ask(
    effects: Effects,
    case: str,
    credit: int,
    call: str,
    *,
    run: str = "run-1",
    note: str = "goodwill credit",
    wait: float = 0.0,
    intent_key: str | None = None,
) -> EffectResult:
    """Set a credit on `case` in run `run`, asked by tool call `call`."""
    return effects.effect(
        tenant="acme",
        run=run,
        action=UPDATE,
        target=case,
        payload={"fields": {"credit": credit}, "note": note},
        authorization_ref=GRANT,
        asked_by=call,
        intent_key=intent_key,
        wait=wait,  # held for a person: answered at once, never after the whole wait
    )


def held(result: EffectResult) -> EffectPending:
    assert isinstance(result, EffectPending) and result.awaiting == "approval", result
    assert result.waiting_for.startswith(("approval by a person", "approval by two people"))
    return result


# -- what the provider received, what the workers did ---------------------------------------


def sent(desk: Desk, op_id: str) -> int:
    """Requests the provider received carrying the operation's key (any of its keys)."""
    marker = desk.ledger.get(op_id).marker
    requests = desk.sandbox.truth()["requests"]
    return sum(len(log) for key, log in requests.items() if key.startswith(f"crm:{marker}"))


def applied(desk: Desk, case: str) -> int:
    """Credits the provider applied to `case`, under whatever key."""
    return desk.sandbox.by_act().get(f"crm:{CRM.account}:update:{case}", 0)


def handed_to_a_worker(desk: Desk, op_id: str) -> None:
    """A dispatch message for `op_id` (a stray or repeated one), taken and finished by the
    real worker: whatever it may do with the operation, it has done."""
    task = dispatch.delay(op_id)
    done = re.compile(rf"opledger\.dispatch\[{task.id}\] (succeeded|raised|retry).*")
    ended = wait_until(
        lambda: done.search(desk.worker.output()),
        30,
        f"the worker to finish dispatch {task.id} of {op_id}",
        every=0.05,
    )
    assert ended.group(1) == "succeeded", ended.group(0)


def untouched(desk: Desk, op_id: str) -> Operation:
    """Held: never claimed (fence 0, no lease), no attempt, nothing at the provider."""
    op = desk.ledger.get(op_id)
    assert (op.status, op.fence, op.lease_owner, op.waiting_on) == (Status.PREPARED, 0, None, 1)
    assert desk.ledger.history(op_id).attempts == ()
    assert sent(desk, op_id) == 0
    return op


def approvals_of(desk: Desk, case: str) -> list[str]:
    """The approval requests ever asked for acts on `case` (their operations)."""
    return [a.op_id for a in desk.ledger.approvals(tenant="acme", status=None) if a.target == case]


def confirmed(desk: Desk, op_id: str) -> None:
    assert settled(desk.ledger, [op_id], 30) == {op_id: Status.CONFIRMED}


# -- the console ----------------------------------------------------------------------------


def open_approval(d: WebDriver, desk: Desk, op_id: str, operator: str) -> None:
    """`operator` signed in, on `op_id`'s approval page."""
    from selenium.webdriver.common.by import By

    browser_sign_in(d, desk.url, operator)
    d.get(f"{desk.url}/t/acme/ops/{op_id}/approval")
    assert d.find_element(By.ID, "op-id").text == op_id


def after_decision(d: WebDriver) -> str:
    """What the page a decision led to says: its banner, or its refusal ("title: why")."""
    from selenium.webdriver.common.by import By

    said = d.find_element(By.CSS_SELECTOR, "#decided, #refusal-title")
    if said.get_attribute("id") == "decided":
        return str(said.text)
    return f"{said.text}: {d.find_element(By.ID, 'refusal').text}"


# -- LangGraph ------------------------------------------------------------------------------


class Credit(BaseModel):
    """The tool's arguments, as the model gives them."""

    case: str
    credit: int


def graph_of(effects: Effects) -> Any:
    """A graph whose tool sets a credit and pauses for an approval, then a node standing
    for the model's last turn: it reads the tool's answer and ends the run."""
    tool = effect_tool(
        effects,
        name="credit_case",
        description="Set a goodwill credit on a case.",
        args_schema=Credit,
        tenant="acme",
        action=UPDATE,
        authorization_ref=GRANT,
        effect_of=lambda a: (a["case"], {"fields": {"credit": a["credit"]}, "note": "goodwill"}),
        wait=20,
        pause_for_approval=True,
    )

    def reply(state: MessagesState) -> dict[str, Any]:
        answer = tool_answer(state)
        return {"messages": [AIMessage(content=f"Done: the credit is {answer['kind']}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_node("reply", reply)
    graph.add_edge(START, "tools")
    graph.add_edge("tools", "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=InMemorySaver())


def model_asks(case: str, credit: int, call: str) -> dict[str, Any]:
    args = {"case": case, "credit": credit}
    return {
        "messages": [
            AIMessage(content="", tool_calls=[{"name": "credit_case", "args": args, "id": call}])
        ]
    }


def tool_answer(state: Any) -> dict[str, Any]:
    message = next(m for m in reversed(state["messages"]) if isinstance(m, ToolMessage))
    answer: dict[str, Any] = json.loads(str(message.content))
    return answer


def resume(graph: Any, config: Any) -> Any:
    return graph.invoke(Command(resume="decided"), config)
