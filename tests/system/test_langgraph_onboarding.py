"""The LangGraph onboarding example (examples/langgraph_onboarding.py) against real workers:
the agent process is SIGKILLed in the middle of a node and the thread resumed, the thread is
replayed from a checkpoint after its effects happened, and forked with another recipient.
Counted at the sandbox providers: one effect per intent, the email never before the close
is confirmed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opledger.dev.chaos.stack import Stack, wait_until
from opledger.dev.chaos.variants import KINDS
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status

from .conftest import settings_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "langgraph_onboarding.py"
THREAD = "onboarding-thread-1"


def _example(stack: Stack, *args: str, timeout: float = 60) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return state


def _ops(ledger: Ledger, action: str) -> list[str]:
    return sorted(
        o.id
        for o in ledger.list(tenant="acme")
        if o.action == action and o.workflow_id.endswith(THREAD)
    )


def _confirmed_at(ledger: Ledger, op_id: str) -> Any:
    return next(t.at for t in ledger.history(op_id).transitions if t.to_status is Status.CONFIRMED)


def test_kill_resume_replay_and_fork_never_repeat_an_effect(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    keyed = KINDS[0]  # crm.close_case.v1: keys and a status API
    settings = settings_of(running.env)
    # the close takes a moment at the provider, so the agent is still inside the node
    sandbox.configure(account=keyed.account, **keyed.sandbox_config(settings), processing_s=0.7)

    # (1) SIGKILL the agent while its close node waits for the effect; resume the thread
    agent = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "run", "--thread", THREAD],
        env=running.env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(
            lambda: _ops(sys_ledger, "crm.close_case.v1"),
            30,
            "the close to be recorded",
            every=0.02,
        )
    finally:
        agent.kill()  # SIGKILL
        agent.wait()
    (close,) = _ops(sys_ledger, "crm.close_case.v1")
    assert not _ops(sys_ledger, "email.send.v1")
    shown = _example(running, "show", "--thread", THREAD)
    assert shown["next"] == ["close"], shown  # killed inside the close node: no checkpoint after

    resumed = _example(running, "resume", "--thread", THREAD)
    (email,) = _ops(sys_ledger, "email.send.v1")
    assert resumed["next"] == []
    kinds = {r["op_id"]: r["kind"] for r in resumed["results"].values()}
    assert kinds == {close: "confirmed", email: "confirmed"}
    assert sandbox.effects(f"crm:{close}") == 1
    assert sandbox.effects(f"email:{email}") == 1

    # (2) time travel: replay from before the close, after both effects happened
    replayed = _example(running, "replay", "--thread", THREAD, "--before", "close")
    assert replayed["results"] == resumed["results"]  # the recorded outcomes, same operations
    assert _ops(sys_ledger, "crm.close_case.v1") == [close]
    assert _ops(sys_ledger, "email.send.v1") == [email]

    # (3) fork with another recipient: a new intent under its own authorization
    forked = _example(
        running,
        "fork",
        "--thread",
        THREAD,
        "--owner",
        "new-owner@acme.test",
        "--authorization",
        "auth_onboarding_fork",
    )
    emails = _ops(sys_ledger, "email.send.v1")
    (new_email,) = set(emails) - {email}
    new_op = sys_ledger.get(new_email)
    assert new_op.target == "new-owner@acme.test"
    assert new_op.authorization_ref == "auth_onboarding_fork"
    assert sys_ledger.get(email).authorization_ref == "auth_onboarding"
    assert {r["op_id"]: r["kind"] for r in forked["results"].values()} == {
        close: "confirmed",
        new_email: "confirmed",
    }

    # counted at the providers: one effect per intent, nothing else applied
    truth = sandbox.truth()["effects"]
    assert truth == {f"crm:{close}": 1, f"email:{email}": 1, f"email:{new_email}": 1}
    # and no email attempt started before the close was confirmed
    closed_at = _confirmed_at(sys_ledger, close)
    for op_id in (email, new_email):
        attempts = sys_ledger.history(op_id).attempts
        assert attempts and all(a.started_at >= closed_at for a in attempts)
        assert [d.op_id for d in sys_ledger.dependencies(op_id)] == [close]
