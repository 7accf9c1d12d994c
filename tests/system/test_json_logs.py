"""OPLEDGER_LOG_FORMAT=json: one operation's log lines are found by its `op_id` across
worker processes — the worker that received its dispatch and was SIGKILLed after the
provider call, and the one that reconciled it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch
from tests.intents import prepare

from .conftest import crashes, settings_of, settled, worker_with

pytestmark = pytest.mark.system


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_one_operations_lines_are_found_by_op_id_across_worker_processes(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    as_json: dict[str, Any] = {"OPLEDGER_LOG_FORMAT": "json"}
    with worker_with(
        running, "crashy", concurrency=1, OPLEDGER_CRASHPOINT="dispatch.after_call", **as_json
    ) as crashy:  # then the plain w1, logging text again
        op_id = prepare(sys_ledger, "logs", action=KINDS[0].action)  # keyed, with a status API
        dispatch.delay(op_id)
        wait_until(lambda: crashes(crashy) >= 1, 30, "the crash after the call")
        crashy_log = crashy.output()
        running.kill_worker("crashy")
        running.start_worker("w1", **as_json)
        assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
        wait_until(
            lambda: any(
                "succeeded" in line["message"] and line.get("op_id") == op_id
                for line in json_lines(running.workers["w1"].output())
            ),
            10,
            "the reconcile's success line",
        )
        lines = json_lines(crashy_log) + json_lines(running.workers["w1"].output())
    assert lines and all({"ts", "level", "logger", "message", "pid"} <= set(x) for x in lines)
    mine = [line for line in lines if line.get("op_id") == op_id]
    assert len({line["pid"] for line in mine}) >= 2, mine  # the killed worker and the other
    assert all(line.get("task_id") for line in mine), mine
    received = [line for line in mine if "received" in line["message"]]
    assert len(received) >= 2, mine  # the dispatch (killed worker) and a reconcile
    decisions = [line for line in mine if line.get("decision")]
    assert decisions, mine
    assert decisions[-1]["action"] == KINDS[0].action and decisions[-1]["tenant"] == "acme"
    assert isinstance(decisions[-1]["fence"], int) and decisions[-1]["attempt"] >= 1
