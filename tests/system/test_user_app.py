"""A user's own Celery app, with its own task, runs opledger's tasks beside it after
`opledger.tasks.register(app)`: one real worker process (`celery -A ... worker`) consumes
both, and the user's task hands an operation to opledger through the user's app."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from celery import Celery

from opledger.dev.processes import Proc, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from tests.intents import key_of

from .conftest import settled

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]


def test_a_user_app_runs_its_own_task_and_opledgers_in_one_worker(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    running.kill_worker("w1")  # only the user's worker consumes now
    env = {**running.env, "PYTHONPATH": str(REPO)}
    argv = ["-A", "tests.system.userapp", "worker", "-c", "2", "--hostname", "user@%h"]
    worker = Proc(
        "user", [*argv, "--loglevel", "INFO"], env, running.workdir / "user.log", module="celery"
    )
    client = Celery("client", broker=running.env["OPLEDGER_BROKER_URL"], set_as_current=False)
    try:
        wait_until(
            lambda: "ready." in worker.output() or worker.proc.poll() is not None,
            60,
            "the user's worker",
        )
        banner = worker.output()
        assert worker.proc.poll() is None, banner[-3000:]
        for queue in ("celery", "dispatch", "reconcile", "maintenance", "notifications"):
            assert f".> {queue} " in banner, queue
        client.send_task("theirs.close_case", ("case-901",), queue="celery")
        # their task prepared it in the ledger and published it through their app
        op_id = wait_until(
            lambda: [o.id for o in sys_ledger.list(tenant="acme") if o.target == "case-901"],
            30,
            "their task to prepare the operation",
        )[0]
        assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
        assert sandbox.effects(f"crm:{key_of(sys_ledger, op_id)}") == 1
        # the outcome commits before the task returns and its success is logged
        log = wait_until(
            lambda: (
                worker.output()
                if re.search(r"Task opledger\.dispatch\[[^\]]+\] succeeded", worker.output())
                else None
            ),
            30,
            "the worker to log the dispatch task's success",
        )
        assert re.search(r"Task theirs\.close_case\[[^\]]+\] succeeded", log)
    finally:
        client.close()
        worker.kill()
