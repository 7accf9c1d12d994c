"""A CI-sized chaos run: a few hundred operations, workers killed at random boundaries,
provider faults, a broker restart, on Redis and on RabbitMQ. The invariants must hold in
every run; completion is reported, never forced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import require_rabbitmq

pytestmark = [pytest.mark.system, pytest.mark.own_processes]

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


#: the same short chaos window on each broker: 14 s of kills, crash points, provider faults
#: and one broker restart (on RabbitMQ: the private virtual host deleted and added again)
RUNS = [
    pytest.param("redis", 240, 7, id="redis"),
    pytest.param("rabbitmq", 160, 11, id="rabbitmq", marks=pytest.mark.rabbitmq),
]


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("broker", "ops", "seed"), RUNS)
def test_ci_sized_chaos_run_keeps_every_invariant(
    broker: str, ops: int, seed: int, own_env: dict[str, str]
) -> None:
    if broker == "rabbitmq":
        require_rabbitmq()
    run = subprocess.run(
        [
            *(sys.executable, "-m", "opledger.cli", "chaos", "--broker", broker),
            *("--ops", str(ops), "--seed", str(seed), "--chaos-seconds", "14", "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=380,
        env=own_env,
    )
    assert run.stdout.strip(), run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert set(summary) >= REQUIRED
    assert summary["broker"] == broker
    assert summary["ops"] == ops and summary["seed"] == seed
    assert summary["duplicate_effects"] == 0, summary["problems"]
    assert summary["dispatches_while_in_flight"] == 0, summary["problems"]
    assert summary["stuck"] == 0 and summary["lost"] == 0, summary["problems"]
    # the rate-limited kind took part, behind a provider stricter than its contract says
    assert summary["rate_limited_calls"]["rate-limited"]["admitted"] > 0
    assert summary["kills"] >= 1 and summary["redis_restarts"] == 1
    assert summary["unexpected_exits"] == 0  # only refusals at start were started again
    settled = summary["confirmed"] + summary["rejected"] + summary["cancelled"]
    assert settled + summary["unknown_in_review"] == ops
    assert run.returncode == 0
