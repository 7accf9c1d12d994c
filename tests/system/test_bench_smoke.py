"""The benchmark machinery on a tiny run: it must keep working, and its one count (not a
timing) must hold: two Postgres round trips per confirmed operation on the worker's path."""

from __future__ import annotations

import pytest

from opledger.bench import BenchConfig, run_bench
from opledger.chaos.stack import Stack

pytestmark = pytest.mark.system


@pytest.mark.timeout(300)
def test_a_tiny_bench_run(stack: Stack) -> None:
    stack.stop_all()  # the bench brings its own broker and workers
    result = run_bench(BenchConfig(tasks=300, sizes=(2_000, 6_000), prepares=50, repeats=1))
    for key in (
        "celery_ops_s",
        "ledger_ops_s",
        "ratio",
        "round_trips_per_op",
        "sweep_ms_10k",
        "sweep_ms_1m",
        "prepare_ops_s",
        "prepare_in_tx_ops_s",
    ):
        assert result[key] > 0, key
    assert 1.95 <= result["round_trips_per_op"] <= 2.1
    assert result["index_scans"], result["sweep_plans"]
