"""The onboarding example (`opledger.examples.langgraph_onboarding`, the repository's
examples/langgraph_onboarding.py): a ReAct LangGraph agent whose chat model invents new
tool-call ids (and rewords its email) every time it is asked, against real workers, with
real SIGKILLs.

Counted at the sandbox providers per business act (a close of a case, an update of its
priority — which the CRM applies again under any new key — and an email to a recipient):
exactly one effect per act in every scenario — a normal run, a kill mid-tool and resume,
time travel from before the model's first turn, a replay between an AI message and its
tool node, forks with the same and with a new recipient, two parallel tool calls killed
between their answers, and each durability mode.

Every run of the agent is a process of its own, ended by its own exit or by a SIGKILL. The
first is started as docs/agents.md starts it (`python -m
opledger.examples.langgraph_onboarding run ...`); the others are forked, each with its
command line, from one process that imported the example module and did nothing else
(`Agents`): importing LangGraph is most of a run's CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opledger.dev.chaos.variants import EMAIL_ACCOUNT, KINDS
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from tests.agentruns import Agents, Run

from .conftest import settings_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
#: the example as users run it: a module of the installed package
AGENT = "opledger.examples.langgraph_onboarding"
CRM = KINDS[0]  # crm.*: keys and a status API


@pytest.fixture(scope="module")
def agents(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    forks = Agents(AGENT, stack.env, tmp_path_factory.mktemp("agents"))
    try:
        yield forks
    finally:
        forks.stop()


@pytest.fixture
def agent(running: Stack, sys_ledger: Ledger, sandbox: Sandbox, agents: Agents) -> Agents:
    settings = settings_of(running.env)
    sandbox.configure(account=CRM.account, **CRM.sandbox_config(settings))
    return agents


def _state(stdout: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return state


def _script(stack: Stack, *args: str, timeout: float = 90) -> dict[str, Any]:
    """A run of the example as docs/agents.md starts it: `python -m
    opledger.examples.langgraph_onboarding`."""
    done = subprocess.run(
        [sys.executable, "-m", AGENT, *args],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return _state(done.stdout)


def _agent(agents: Agents, *args: str) -> dict[str, Any]:
    """A run of the example agent, to its end."""
    run = agents.start(*args)
    assert run.wait() == 0, run.err.read_text()[-4000:]
    return _state(run.out.read_text())


def _kill_when(run: Run, ready: Any, what: str) -> None:
    try:
        wait_until(ready, 60, what, every=0.02)
    finally:
        run.kill()  # SIGKILL


def _ops(ledger: Ledger, thread: str, action: str | None = None) -> list[Any]:
    return [
        o
        for o in ledger.list(tenant="acme", limit=1000)
        if o.workflow_id == f"langgraph:{thread}" and (action is None or o.action == action)
    ]


def _acts(sandbox: Sandbox, case: str, *owners: str) -> dict[str, int]:
    acts = sandbox.by_act()
    names = [
        f"crm:{CRM.account}:close:{case}",
        f"crm:{CRM.account}:update:{case}",
        *(f"email:{EMAIL_ACCOUNT}:{owner}" for owner in owners),
    ]
    return {name: acts.get(name, 0) for name in names}


def _once(sandbox: Sandbox, case: str, *owners: str) -> None:
    acts = _acts(sandbox, case, *owners)
    assert acts == dict.fromkeys(acts, 1), acts


def _completed(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run ended with the model's final answer; the tools' last answers by name."""
    assert state["next"] == [], state
    last = state["messages"][-1]
    assert last["type"] == "ai" and last["content"].startswith("Done:"), last
    return {m["name"]: json.loads(m["content"]) for m in state["messages"] if m["type"] == "tool"}


def _settled(ledger: Ledger, thread: str, count: int) -> None:
    wait_until(
        lambda: (
            len(ops := _ops(ledger, thread)) == count
            and all(o.status is Status.CONFIRMED for o in ops)
        ),
        60,
        f"{count} confirmed operations of {thread}",
        every=0.2,
    )


def test_a_run_then_time_travel_replay_and_forks_cause_each_act_once(
    agent: Agents, running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    thread, case, owner = "reask-1", "case-501", "owner-501@acme.test"
    # this first run as a user starts the script; the others are forked (`Agents`)
    first = _completed(
        _script(running, "run", "--thread", thread, "--case", case, "--owner", owner)
    )
    assert {a["kind"] for a in first.values()} == {"confirmed"}
    assert not any(a["asked_before"] for a in first.values())
    assert first["tag_case"]["data"]["version"] == 3  # the provider's result data
    _once(sandbox, case, owner)
    recorded = {o.id for o in _ops(sys_ledger, thread)}
    assert len(recorded) == 3
    # the model asked for the email only once the close was confirmed
    (close,) = _ops(sys_ledger, thread, "crm.close_case.v1")
    (email_op,) = _ops(sys_ledger, thread, "email.send.v1")
    closed_at = next(
        t.at for t in sys_ledger.history(close.id).transitions if t.to_status is Status.CONFIRMED
    )
    assert email_op.created_at > closed_at

    # time travel to before the model's first turn: asked again, new ids, a new email body
    travelled = _completed(_agent(agent, "travel", "--thread", thread, "--to", "first-turn"))
    assert {n: a["op_id"] for n, a in travelled.items()} == {
        n: a["op_id"] for n, a in first.items()
    }
    assert all(a["asked_before"] and a["kind"] == "confirmed" for a in travelled.values())
    email = travelled["email_owner"]
    assert email["differs"] == ["payload.text"]  # the reworded body: answered, not sent
    assert "already asked" in email["message"] and "`repeat` set to 2" in email["message"]
    assert travelled["tag_case"]["differs"] == ["payload.note"]
    _once(sandbox, case, owner)

    # replay from between the first AI message and its tool node: the close keeps its id,
    # and the loop asks the model again for the second turn
    _completed(_agent(agent, "travel", "--thread", thread, "--to", "first-tools"))
    _once(sandbox, case, owner)
    assert {o.id for o in _ops(sys_ledger, thread)} == recorded

    # every ask is kept as evidence of which call asked, under its own tool-call id
    asks = sys_ledger.asks(close.id)
    assert len(asks) == 3 and asks[0].differs == () and len({a.asked_by for a in asks}) == 2

    # a fork with the same recipient under another grant: nothing new
    _completed(
        _agent(
            agent,
            "fork",
            "--thread",
            thread,
            "--owner",
            owner,
            "--authorization",
            "auth_fork",
        )
    )
    _once(sandbox, case, owner)
    assert {o.id for o in _ops(sys_ledger, thread)} == recorded

    # the original grant is revoked; a fork with a new recipient under the fork's grant:
    # one email to the new recipient, the close and the update are the recorded ones
    sys_ledger.revoke("auth_onboarding", by="t", reason="rotated")
    new_owner = "new-owner-501@acme.test"
    forked = _completed(
        _agent(
            agent,
            "fork",
            "--thread",
            thread,
            "--owner",
            new_owner,
            "--authorization",
            "auth_fork",
        )
    )
    assert forked["email_owner"]["asked_before"] is False
    assert forked["close_case"]["asked_before"] and forked["tag_case"]["asked_before"]
    _once(sandbox, case, owner, new_owner)
    (new_email,) = {o.id for o in _ops(sys_ledger, thread)} - recorded
    assert sys_ledger.get(new_email).authorization_ref == "auth_fork"
    assert sys_ledger.get(new_email).target == new_owner


def test_a_fork_to_a_new_recipient_without_a_grant_in_force_is_refused_to_the_model(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    thread, case, owner = "reask-2", "case-502", "owner-502@acme.test"
    _completed(
        _agent(
            agent,
            "run",
            "--thread",
            thread,
            "--case",
            case,
            "--owner",
            owner,
            "--graph",
            "react",
        )
    )
    sys_ledger.revoke("auth_onboarding", by="t", reason="the run is over")
    state = _agent(
        agent,
        "fork",
        "--thread",
        thread,
        "--owner",
        "other@acme.test",
        "--authorization",
        "auth_onboarding",
    )
    refused = [m for m in state["messages"] if m["type"] == "tool" and m["status"] == "error"]
    (answer,) = [json.loads(m["content"]) for m in refused]
    assert answer["kind"] == "refused" and answer["error"] == "AuthorizationRevoked"
    _once(sandbox, case, owner)
    assert _acts(sandbox, case, "other@acme.test")[f"email:{EMAIL_ACCOUNT}:other@acme.test"] == 0


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
def test_a_kill_mid_tool_then_resume_or_rerun_causes_each_act_once(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox, durability: str
) -> None:
    """Killed while the close executes at the provider. With a checkpoint (sync, async)
    the thread is resumed; with durability "exit" nothing was saved, so the user runs it
    again from the start, and the model is asked again for everything."""
    case = {"sync": "case-511", "async": "case-512", "exit": "case-513"}[durability]
    thread, owner = f"reask-kill-{durability}", f"{durability}@acme.test"
    sandbox.configure(account=CRM.account, processing_s=0.7)
    run = ("run", "--thread", thread, "--case", case, "--owner", owner, "--durability", durability)
    _kill_when(
        agent.start(*run),
        lambda: _ops(sys_ledger, thread, "crm.close_case.v1"),
        "the close to be recorded",
    )
    sandbox.configure(account=CRM.account, processing_s=0.0)
    if durability == "exit":
        final = _agent(agent, *run)
    else:
        final = _agent(agent, "resume", "--thread", thread, "--durability", durability)
    answers = _completed(final)
    assert answers["close_case"]["kind"] == "confirmed"
    _settled(sys_ledger, thread, 3)
    _once(sandbox, case, owner)


def test_two_parallel_tool_calls_killed_between_their_answers(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    """The update answers at once, the email takes 2 s at the provider: the agent dies
    after the first answer and before the second; the resumed tool node runs both again."""
    thread, case, owner = "reask-parallel", "case-520", "p@acme.test"
    sandbox.configure(account=EMAIL_ACCOUNT, processing_s=2.0)

    def between() -> bool:
        update = _ops(sys_ledger, thread, "crm.update_case.v1")
        email = _ops(sys_ledger, thread, "email.send.v1")
        return bool(update and email and update[0].status is Status.CONFIRMED)

    _kill_when(
        agent.start("run", "--thread", thread, "--case", case, "--owner", owner),
        between,
        "the update confirmed while the email is in flight",
    )
    sandbox.configure(account=EMAIL_ACCOUNT, processing_s=0.0)
    answers = _completed(_agent(agent, "resume", "--thread", thread))
    assert answers["tag_case"]["asked_before"] and answers["email_owner"]["asked_before"]
    _settled(sys_ledger, thread, 3)
    _once(sandbox, case, owner)
