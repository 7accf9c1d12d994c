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
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opledger.dev.chaos.variants import EMAIL_ACCOUNT, KINDS
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status

from .conftest import settings_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "openai_agents_support.py"
MODULE = "opledger.examples.openai_agents_support"  # as the docs start it
CRM = KINDS[0]  # crm.*: keys and a status API

#: Imports the example (the Agents SDK, SQLAlchemy's asyncio, opledger) once and nothing
#: more, then forks one process per command line it reads: the child runs the example's
#: `main` with it, its output in files, and exits as the script would. It answers with the
#: child's pid, then reads "wait" (for it) or "kill" (SIGKILL now), and answers with its
#: exit code once it reaped it.
FORK_SERVER = r"""
import importlib.util, json, os, signal, sys

spec = importlib.util.spec_from_file_location("openai_agents_support", sys.argv[1])
example = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = example
spec.loader.exec_module(example)
print("ready", flush=True)
for line in sys.stdin:
    argv, out, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        sys.stdin = open(os.devnull)
        os.dup2(sys.stdin.fileno(), 0)
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = [sys.argv[1], *argv]
        sys.exit(example.main(argv))
    print(pid, flush=True)
    if sys.stdin.readline() == "kill\n":
        os.kill(pid, signal.SIGKILL)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Agents:
    """Runs of the example agent, each a process of its own, forked from `FORK_SERVER`."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.workdir = workdir
        self.server = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER, str(AGENT)],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            start_new_session=True,  # its runs are in its group: reaped with it
        )
        self._buffer = b""
        self.runs = 0
        assert self.line(120) == "ready"

    def line(self, timeout: float) -> str:
        assert self.server.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([self.server.stdout], [], [], deadline - time.monotonic())
            chunk = os.read(self.server.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                raise AssertionError(
                    f"the agents' fork server: no answer (exit {self.server.poll()})"
                )
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def start(self, *args: str) -> Run:
        self.runs += 1
        out, err = (self.workdir / f"agent-{self.runs}.{name}" for name in ("out", "err"))
        self.tell(json.dumps([list(args), str(out), str(err)]))
        return Run(self, int(self.line(30)), out, err)

    def tell(self, line: str) -> None:
        assert self.server.stdin is not None
        self.server.stdin.write(f"{line}\n".encode())

    def stop(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()  # it ends when its input does
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
        finally:
            assert self.server.stdout is not None
            self.server.stdout.close()


class Run:
    """One run of the example agent: a live process until `wait` or `kill` returns."""

    def __init__(self, agents: Agents, pid: int, out: Path, err: Path) -> None:
        self.agents, self.pid, self.out, self.err = agents, pid, out, err

    def wait(self, timeout: float = 90) -> int:
        self.agents.tell("wait")
        try:
            return int(self.agents.line(timeout))
        except AssertionError:
            os.kill(self.pid, signal.SIGKILL)  # not reaped: still this run's pid
            self.agents.line(30)
            raise

    def kill(self) -> None:
        self.agents.tell("kill")
        code = int(self.agents.line(30))
        assert code == -signal.SIGKILL, f"the run ended (exit {code}) before it was killed"


@pytest.fixture(scope="module")
def agents(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    forks = Agents(stack.env, tmp_path_factory.mktemp("openai-agents"))
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
