"""The support example on the OpenAI Agents SDK (examples/openai_agents_support.py): an
agent whose model invents new call ids (and rewords its note and email) every time it is
asked, its conversation in a session, against real workers, with real SIGKILLs.

Counted at the sandbox providers per business act (a close of a case, an update of it —
which the CRM applies again under any new key — and an email to a recipient): exactly one
effect per act in every scenario — a normal run, then a retry that takes the model's turns
back (asked again: new ids, reworded, answered with the recorded operations and what
differs); a kill mid-tool, resumed with the same session; two parallel calls killed
between their answers; an approved call killed mid-tool and approved again from the same
saved `RunState`.

Every run of the agent is a process of its own, ended by its own exit or by a SIGKILL. The
first is started as the docs start it (`python -m opledger.examples.openai_agents_support
run ...`);
the others are forked, each with its command line, from one process that imported the
example and did nothing else (`Agents`): importing the SDK is most of a run's CPU.
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
MODULE = "opledger.examples.openai_agents_support"  # as the docs start it
CRM = KINDS[0]  # crm.*: keys and a status API


@pytest.fixture(scope="module")
def agents(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    forks = Agents(MODULE, stack.env, tmp_path_factory.mktemp("openai-agents"))
    try:
        yield forks
    finally:
        forks.stop()


@pytest.fixture
def agent(running: Stack, sys_ledger: Ledger, sandbox: Sandbox, agents: Agents) -> Agents:
    sandbox.configure(account=CRM.account, **CRM.sandbox_config(settings_of(running.env)))
    return agents


def _state(stdout: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return state


def _agent(agents: Agents, *args: str) -> dict[str, Any]:
    run = agents.start(*args)
    assert run.wait() == 0, run.err.read_text()[-4000:]
    return _state(run.out.read_text())


def _kill_when(run: Run, ready: Any, what: str) -> None:
    try:
        wait_until(ready, 60, what, every=0.02)
    finally:
        run.kill()  # SIGKILL


def _ops(ledger: Ledger, session: str, action: str | None = None) -> list[Any]:
    return [
        o
        for o in ledger.list(tenant="acme", limit=1000)
        if o.workflow_id == f"openai-agents:session:{session}"
        and (action is None or o.action == action)
    ]


def _once(sandbox: Sandbox, case: str, owner: str) -> None:
    acts = sandbox.by_act()
    names = [
        f"crm:{CRM.account}:close:{case}",
        f"crm:{CRM.account}:update:{case}",
        f"email:{EMAIL_ACCOUNT}:{owner}",
    ]
    counted = {name: acts.get(name, 0) for name in names}
    assert counted == dict.fromkeys(names, 1), counted


def _answers(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run ended with the model's final answer; the tools' last answers by name."""
    assert state["final_output"].startswith("Done:"), state
    names = {i["call_id"]: i["name"] for i in state["items"] if i["type"] == "function_call"}
    return {
        names[i["call_id"]]: i["output"]
        for i in state["items"]
        if i["type"] == "function_call_output"
    }


def _settled(ledger: Ledger, session: str) -> None:
    wait_until(
        lambda: (
            len(ops := _ops(ledger, session)) == 3
            and all(o.status is Status.CONFIRMED for o in ops)
        ),
        60,
        f"3 confirmed operations of {session}",
        every=0.2,
    )


def test_a_run_then_a_retry_with_new_ids_and_wording_cause_each_act_once(
    agent: Agents, running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    session, case, owner = "oa-1", "case-601", "owner-601@acme.test"
    # the first run as the docs start it; the others are forked (`Agents`)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            MODULE,
            "run",
            "--session",
            session,
            "--case",
            case,
            "--owner",
            owner,
        ],
        env=running.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    first = _answers(_state(done.stdout))
    assert {a["kind"] for a in first.values()} == {"confirmed"}
    assert not any(a["asked_before"] for a in first.values())
    assert first["tag_case"]["data"]["version"] == 3  # the provider's result data
    _once(sandbox, case, owner)
    recorded = {o.id for o in _ops(sys_ledger, session)}
    assert len(recorded) == 3
    (close,) = _ops(sys_ledger, session, "crm.close_case.v1")
    (email,) = _ops(sys_ledger, session, "email.send.v1")
    closed_at = next(
        t.at for t in sys_ledger.history(close.id).transitions if t.to_status is Status.CONFIRMED
    )
    assert email.created_at > closed_at  # asked for only once the close was confirmed

    # the session's turns taken back: the model asked again, new ids, reworded
    again = _answers(_agent(agent, "retry", "--session", session))
    assert {n: a["op_id"] for n, a in again.items()} == {n: a["op_id"] for n, a in first.items()}
    assert all(a["asked_before"] and a["kind"] == "confirmed" for a in again.values())
    assert again["email_owner"]["differs"] == ["payload.text"]  # answered, not sent
    assert "already asked" in again["email_owner"]["message"]
    assert "`repeat` set to 2" in again["email_owner"]["message"]
    assert again["tag_case"]["differs"] == ["payload.note"]
    assert "differs" not in again["close_case"]
    _once(sandbox, case, owner)
    assert {o.id for o in _ops(sys_ledger, session)} == recorded
    # each ask is kept under its own call id, as evidence: never the key
    asks = sys_ledger.asks(close.id)
    assert len(asks) == 2 and len({a.asked_by for a in asks}) == 2
    assert all(str(a.asked_by).startswith("close_case:call_") for a in asks)


def test_a_kill_mid_tool_then_resume_with_the_session_causes_each_act_once(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    """Killed while the close executes at the provider: the session holds the user's
    message only; resumed, the model asks again under a new id and gets the recorded
    close."""
    session, case, owner = "oa-kill", "case-611", "kill@acme.test"
    sandbox.configure(account=CRM.account, processing_s=0.7)
    _kill_when(
        agent.start("run", "--session", session, "--case", case, "--owner", owner),
        lambda: _ops(sys_ledger, session, "crm.close_case.v1"),
        "the close to be recorded",
    )
    sandbox.configure(account=CRM.account, processing_s=0.0)
    answers = _answers(_agent(agent, "resume", "--session", session))
    assert answers["close_case"]["kind"] == "confirmed" and answers["close_case"]["asked_before"]
    _settled(sys_ledger, session)
    _once(sandbox, case, owner)


def test_two_parallel_calls_killed_between_their_answers(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    """The update answers at once, the email takes 1 s at the provider: the agent dies
    after the first answer and before the second; resumed, the model asks for both again."""
    session, case, owner = "oa-parallel", "case-620", "p@acme.test"
    sandbox.configure(account=EMAIL_ACCOUNT, processing_s=1.0)

    def between() -> bool:
        update = _ops(sys_ledger, session, "crm.update_case.v1")
        email = _ops(sys_ledger, session, "email.send.v1")
        return bool(update and email and update[0].status is Status.CONFIRMED)

    _kill_when(
        agent.start("run", "--session", session, "--case", case, "--owner", owner),
        between,
        "the update confirmed while the email is in flight",
    )
    sandbox.configure(account=EMAIL_ACCOUNT, processing_s=0.0)
    answers = _answers(_agent(agent, "resume", "--session", session))
    assert answers["tag_case"]["asked_before"] and answers["email_owner"]["asked_before"]
    _settled(sys_ledger, session)
    _once(sandbox, case, owner)


def test_an_approved_call_killed_mid_tool_and_approved_again_is_one_close(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox, tmp_path: Path
) -> None:
    """The close needs approval: the run stops and its `RunState` is saved; approved, the
    run dies while the close executes; the same saved state approved again runs the same
    call again (the SDK re-runs an approved tool): answered with the recorded close."""
    session, case, owner = "oa-approval", "case-630", "approval@acme.test"
    state = str(tmp_path / "state.json")
    waiting = _agent(
        agent, "run", "--session", session, "--case", case, "--owner", owner,
        "--approval", "--state", state,
    )  # fmt: skip
    assert waiting["interruptions"] == ["close_case"] and not _ops(sys_ledger, session)
    sandbox.configure(account=CRM.account, processing_s=0.7)
    _kill_when(
        agent.start("approve", "--session", session, "--state", state),
        lambda: _ops(sys_ledger, session, "crm.close_case.v1"),
        "the approved close to be recorded",
    )
    sandbox.configure(account=CRM.account, processing_s=0.0)
    answers = _answers(_agent(agent, "approve", "--session", session, "--state", state))
    assert answers["close_case"]["asked_before"] and answers["close_case"]["kind"] == "confirmed"
    (close,) = _ops(sys_ledger, session, "crm.close_case.v1")
    assert len({a.asked_by for a in sys_ledger.asks(close.id)}) == 1  # the same call, twice
    _settled(sys_ledger, session)
    _once(sandbox, case, owner)
