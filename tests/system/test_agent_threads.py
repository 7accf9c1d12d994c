"""Effects asked for from 20 threads and from an event loop, in a process whose main
thread alone imported opledger's tasks: every dispatch goes at once to the configured
broker (Celery's *current* app is per thread; in any other thread it is Celery's default
app, whose broker is amqp://guest@localhost//). The beat is stopped throughout, so no relay
can make up for a message published elsewhere: each effect is confirmed within the wait
only if its first publish reached the workers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from opledger.dev.chaos.variants import KINDS
from opledger.dev.processes import Stack
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status

from .conftest import settings_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
AGENT = Path(__file__).with_name("threaded_agent.py")
THREADS, COROUTINES, WAIT_S = 20, 5, 20.0


def test_effects_from_threads_and_an_event_loop_are_published_to_the_configured_broker(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    sandbox.configure(account=KINDS[0].account, **KINDS[0].sandbox_config(settings_of(running.env)))
    sys_ledger.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_agent")
    assert running.beat is not None
    running.beat.stop()  # no relay: only the first publish can reach a worker
    done = subprocess.run(
        [sys.executable, str(AGENT), "threads-1", str(THREADS), str(COROUTINES), str(WAIT_S)],
        env=running.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT_S + 60,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == THREADS + COROUTINES
    assert {kind for kind, _ in results.values()} == {"confirmed"}, results
    assert max(waited for _, waited in results.values()) < WAIT_S / 2, results
    ops = [o for o in sys_ledger.list(tenant="acme", limit=100) if o.workflow_id == "threads-1"]
    assert len(ops) == THREADS + COROUTINES
    assert all(o.status is Status.CONFIRMED for o in ops)
    acts = sandbox.by_act()
    assert all(acts[f"crm:{KINDS[0].account}:update:case-{name}"] == 1 for name in results)
