"""A CI-sized chaos run: a few hundred operations, workers killed at random boundaries,
provider faults, a Redis restart. The invariants must hold in every run; completion is
reported, never forced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from opledger.dev.chaos.stack import Stack

pytestmark = pytest.mark.system

REQUIRED = {
    "ops",
    "confirmed",
    "rejected",
    "cancelled",
    "unknown_in_review",
    "stuck",
    "lost",
    "duplicate_effects",
    "dispatches_while_in_flight",
    "completion_rate",
    "ops_per_s",
    "kills",
    "seed",
}


@pytest.mark.timeout(400)
def test_ci_sized_chaos_run_keeps_every_invariant(stack: Stack) -> None:
    stack.stop_all()  # the run brings its own broker, providers and workers
    run = subprocess.run(
        [sys.executable, "-m", "opledger.cli", "chaos", "--ops", "240", "--seed", "7", "--json"],
        capture_output=True,
        text=True,
        timeout=380,
        env={k: v for k, v in stack.env.items() if k in ("PATH", "HOME", "OPLEDGER_DATABASE_URL")},
    )
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert set(summary) >= REQUIRED
    assert summary["ops"] == 240 and summary["seed"] == 7
    assert summary["duplicate_effects"] == 0, summary["problems"]
    assert summary["dispatches_while_in_flight"] == 0, summary["problems"]
    assert summary["stuck"] == 0 and summary["lost"] == 0, summary["problems"]
    assert summary["kills"] >= 1 and summary["redis_restarts"] == 1
    settled = summary["confirmed"] + summary["rejected"] + summary["cancelled"]
    assert settled + summary["unknown_in_review"] == 240
    assert run.returncode == 0


ARGS = ["--ops", "160", "--seed", "11", "--json"]


@pytest.mark.rabbitmq
@pytest.mark.timeout(400)
@pytest.mark.skipif(
    os.environ.get("OPLEDGER_TEST_RABBITMQ") != "all",
    reason="a chaos run on RabbitMQ only with OPLEDGER_TEST_RABBITMQ=all (suite budget)",
)
def test_a_chaos_run_on_rabbitmq_keeps_every_invariant(stack: Stack) -> None:
    """The same run on a private RabbitMQ vhost; its restart deletes the vhost (every queued
    message and connection lost) and adds it again."""
    stack.stop_all()
    run = subprocess.run(
        [sys.executable, "-m", "opledger.cli", "chaos", "--broker", "rabbitmq", *ARGS],
        capture_output=True,
        text=True,
        timeout=380,
        env={k: v for k, v in stack.env.items() if k in ("PATH", "HOME", "OPLEDGER_DATABASE_URL")},
    )
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["broker"] == "rabbitmq" and summary["ops"] == 160
    assert summary["duplicate_effects"] == 0, summary["problems"]
    assert summary["dispatches_while_in_flight"] == 0, summary["problems"]
    assert summary["stuck"] == 0 and summary["lost"] == 0, summary["problems"]
    assert summary["kills"] >= 1 and summary["redis_restarts"] == 1
    assert run.returncode == 0
