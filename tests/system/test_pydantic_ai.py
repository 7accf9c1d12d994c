"""The Pydantic AI example (examples/pydantic_ai_support.py): a support agent whose model
(a `FunctionModel`) invents new tool-call ids and rewords its note and email every time it
is asked, against real workers, with real SIGKILLs.

Counted at the sandbox providers per business act (a close of a case, an update of its
resolution — which the CRM applies again under any new key — and an email to a
recipient): exactly one effect per act in every scenario — a normal run; the agent run
again (the model re-asked under new ids, its wording changed: answered with the recorded
operations and `differs`); a new recipient under a revoked grant (refused, in words the
model reads, and the run goes on); a kill while the close executes, then the agent run
again in the ticket's run, or under DBOS the workflow recovered (its model step replayed,
the interrupted tool run again: answered with the recorded operation).

The first run is started as the docs start it (`python -m
opledger.examples.pydantic_ai_support`); the others are forked, each with its command
line, from one process that imported the example and did nothing else
(`tests.agentruns`): importing Pydantic AI is most of a run's CPU.
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
from tests.agentruns import Agents
from tests.conftest import PostgresServer

from .conftest import settings_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
MODULE = "opledger.examples.pydantic_ai_support"  # as the docs start it
CRM = KINDS[0]  # crm.*: keys and a status API


@pytest.fixture(scope="module")
def dbos_url(pg_server: PostgresServer) -> Iterator[str]:
    """DBOS's system database: one of this module's own on the suite's Postgres."""
    url = pg_server.create_database("opledger_pai_dbos")
    yield url
    pg_server.drop_database(url)


@pytest.fixture(scope="module")
def agents(
    stack: Stack, dbos_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Agents]:
    env = {**stack.env, "DBOS_SYSTEM_DATABASE_URL": dbos_url}
    forks = Agents(MODULE, env, tmp_path_factory.mktemp("pai-agents"))
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


def _agent(agents: Agents, *args: str) -> dict[str, Any]:
    """A run of the example agent, to its end."""
    run = agents.start(*args)
    assert run.wait() == 0, run.err.read_text()[-4000:]
    return _state(run.out.read_text())


def _ops(ledger: Ledger, run: str, action: str | None = None) -> list[Any]:
    return [
        o
        for o in ledger.list(tenant="acme", limit=1000)
        if o.workflow_id == run and (action is None or o.action == action)
    ]


def _once(sandbox: Sandbox, case: str, *customers: str) -> None:
    acts = sandbox.by_act()
    names = [
        f"crm:{CRM.account}:close:{case}",
        f"crm:{CRM.account}:update:{case}",
        *(f"email:{EMAIL_ACCOUNT}:{c}" for c in customers),
    ]
    counted = {name: acts.get(name, 0) for name in names}
    assert counted == dict.fromkeys(names, 1), counted


def _completed(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run ended with the model's final answer; each tool's last call by name."""
    assert state["output"].startswith("Done:"), state
    return {c["tool"]: c for c in state["calls"]}


def test_a_run_then_the_model_asked_again_causes_each_act_once(
    agent: Agents, running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    ticket, case, customer = "pai-1", "case-601", "c601@acme.test"
    args = ("--ticket", ticket, "--case", case, "--customer", customer)
    done = subprocess.run(  # as the docs start it
        [sys.executable, "-m", MODULE, "run", *args],
        env=running.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    first = _completed(_state(done.stdout))
    assert {c["answer"]["kind"] for c in first.values()} == {"confirmed"}
    assert not any(c["answer"]["asked_before"] for c in first.values())
    _once(sandbox, case, customer)
    recorded = {o.id for o in _ops(sys_ledger, f"support:{ticket}")}
    assert len(recorded) == 3

    # the agent run again: the model asked again, new ids, a new note and email body
    again = _completed(_agent(agent, "resume", *args))
    assert {n: c["answer"]["op_id"] for n, c in again.items()} == {
        n: c["answer"]["op_id"] for n, c in first.items()
    }
    assert all(c["answer"]["asked_before"] for c in again.values())
    assert all(again[n]["id"] != first[n]["id"] for n in first)
    email = again["email_customer"]["answer"]
    assert email["differs"] == ["payload.text"]  # the reworded body: answered, not sent
    assert "already asked" in email["message"] and "`repeat` set to 2" in email["message"]
    assert again["record_resolution"]["answer"]["differs"] == ["payload.note"]
    _once(sandbox, case, customer)
    # every ask is kept as evidence of which call asked, under its own tool-call id
    (close,) = _ops(sys_ledger, f"support:{ticket}", "crm.close_case.v1")
    assert [a.asked_by for a in sys_ledger.asks(close.id)] == [
        f"close_case:{first['close_case']['id']}",
        f"close_case:{again['close_case']['id']}",
    ]

    # the grant revoked, a new recipient: refused, read by the model; the run goes on
    sys_ledger.revoke("auth_support", by="t", reason="the ticket is closed")
    other = _completed(_agent(agent, "run", *args[:4], "--customer", "other@acme.test"))
    refused = other["email_customer"]
    assert refused["outcome"] == "failed" and refused["answer"]["kind"] == "refused"
    assert refused["answer"]["error"] == "AuthorizationRevoked"
    assert other["close_case"]["answer"]["asked_before"]
    _once(sandbox, case, customer)
    assert sandbox.by_act().get(f"email:{EMAIL_ACCOUNT}:other@acme.test", 0) == 0
    assert {o.id for o in _ops(sys_ledger, f"support:{ticket}")} == recorded


@pytest.mark.parametrize("mode", ["plain", "dbos"])
def test_a_kill_mid_tool_then_resume_causes_each_act_once(
    agent: Agents, sys_ledger: Ledger, sandbox: Sandbox, mode: str
) -> None:
    """Killed while the close executes at the provider. Plain, the agent is run again
    in the ticket's run (the model asked again, under new ids); under DBOS, the workflow
    is recovered (its recorded model step replayed: the same id) and the close's tool runs
    again."""
    ticket, case, customer = f"pai-kill-{mode}", f"case-61{len(mode)}", f"{mode}@acme.test"
    args = ["--ticket", ticket, "--case", case, "--customer", customer]
    if mode == "dbos":
        args.append("--dbos")
    run_id = f"dbos:support-{ticket}" if mode == "dbos" else f"support:{ticket}"
    sandbox.configure(account=CRM.account, processing_s=0.7)
    started = agent.start("run", *args)
    try:
        wait_until(
            lambda: _ops(sys_ledger, run_id, "crm.close_case.v1"),
            60,
            "the close to be recorded",
            every=0.02,
        )
    finally:
        started.kill()  # SIGKILL, mid-tool
    sandbox.configure(account=CRM.account, processing_s=0.0)
    answers = _completed(_agent(agent, "resume", *args))
    assert answers["close_case"]["answer"]["kind"] == "confirmed"
    assert answers["close_case"]["answer"]["asked_before"]
    wait_until(
        lambda: (
            len(ops := _ops(sys_ledger, run_id)) == 3
            and all(o.status is Status.CONFIRMED for o in ops)
        ),
        60,
        f"3 confirmed operations of {run_id}",
        every=0.2,
    )
    _once(sandbox, case, customer)
    (close,) = _ops(sys_ledger, run_id, "crm.close_case.v1")
    askers = [a.asked_by for a in sys_ledger.asks(close.id)]
    assert askers[-1] == f"close_case:{answers['close_case']['id']}"
    # DBOS replayed the model's recorded response; run again, the model gave a new id
    assert (askers[0] == askers[1]) is (mode == "dbos"), askers
