"""`opledger dev bench`'s table: every measure is printed with its target, whichever parts
of the bench ran (`--backlog-only` runs no sweep)."""

from __future__ import annotations

import pytest

from opledger.cli.benchtables import print_bench
from opledger.dev.bench.config import BenchConfig


def test_a_backlog_only_result_prints_without_the_sweep_targets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_bench(
        {"backlog_ratio": 0.95, "backlog_wipe_settled": 200}, BenchConfig(backlog=200).backlog
    )
    out = capsys.readouterr().out
    assert "backlog_ratio" in out and ">= 0.9" in out and "= 200" in out
    assert "sweep_ms_10k" not in out


def test_the_sweep_target_is_twice_the_small_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    print_bench({"sweep_ms_10k": 1.25, "sweep_ms_1m": 2.0}, BenchConfig().backlog)
    assert "<= 2 x sweep_ms_10k = 2.5" in capsys.readouterr().out
