"""The newcomer path: the demo's entry point from a clean clone, with no service URLs set,
on its own embedded Postgres and Redis; and what it leaves behind: nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.system, pytest.mark.own_processes]

REPO = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")


def _clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    if (REPO / ".git").exists():
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        return clone
    return REPO  # not a git checkout: the tree as it is


def _env(clone: Path, tmp_path: Path) -> dict[str, str]:
    """No service URLs; its own temporary and state directories, to look into after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
    for name in ("tmp", "state"):
        (tmp_path / name).mkdir()
    env.update(
        PYTHONPATH=str(clone),
        COLUMNS="200",
        OPLEDGER_STATE_DIR=str(tmp_path / "state"),
        TMPDIR=str(tmp_path / "tmp"),
    )
    return env


def _left_behind(tmp_path: Path, pid: int) -> list[str]:
    """Files and processes of the demo run `pid` still there."""
    left = [str(p) for name in ("tmp", "state") for p in (tmp_path / name).iterdir()]
    if SHM.is_dir():
        left += [str(p) for p in SHM.iterdir() if p.name.startswith(f"opl-{pid}-")]
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(tmp_path) in f"{proc.info['cwd']} {cmdline}" or f"opl-{pid}-" in cmdline:
            left.append(f"process {proc.pid}: {cmdline[:200]}")
    return left


@pytest.mark.timeout(240)
def test_the_demo_runs_from_a_clean_clone_with_zero_duplicates(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    env = _env(clone, tmp_path)
    where = subprocess.run(
        [sys.executable, "-c", "import opledger; print(opledger.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip().startswith(str(clone))
    run = subprocess.Popen(
        [sys.executable, "-m", "opledger.cli", "demo", "--json"],
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = run.communicate(timeout=220)
    assert run.returncode == 0, (stdout[-4000:], stderr[-4000:])
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["duplicate_effects"] == 0
    assert summary["dispatches_while_in_flight"] == 0
    assert summary["stuck"] == 0 and summary["lost"] == 0
    assert summary["ops"] >= 14
    assert "the story" in stdout and "Redis restarted" in stdout
    assert "Postgres restarted" in stdout  # it owned its embedded Postgres, so it could
    assert "scenario 1/9" in stdout  # the phases, one line each when not on a terminal
    assert "opledger.examples.langgraph_onboarding" in stdout  # where the agent's version is
    # Each operation is labelled with what it does: its own action and target.
    rows = {row["scenario"]: row for row in summary["rows"]}
    assert len(rows) == 9
    lagging = rows["1. changed payload, lagging search"]
    assert lagging["outcome"].splitlines() == [
        "close case-318: confirmed",
        "close case-318 (CRM: search): unknown",
    ]
    assert rows["4. email accepted, receipt lost"]["outcome"].splitlines() == [
        "email owner: confirmed (accepted, not delivered)",
        "email owner (SMTP): unknown",
    ]
    # Nothing left: its directories, its temporary files, its processes.
    assert summary["dirs"] and not any(Path(d).exists() for d in summary["dirs"])
    assert _left_behind(tmp_path, run.pid) == []


@pytest.mark.timeout(120)
def test_an_interrupted_demo_stops_everything_and_leaves_nothing(tmp_path: Path) -> None:
    env = _env(REPO, tmp_path)
    with subprocess.Popen(
        [sys.executable, "-m", "opledger.cli", "demo"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as run:
        assert run.stdout is not None
        seen = []
        for line in run.stdout:  # until the workers, beat, Postgres, Redis, sandbox are up
            seen.append(line)
            if "scenario 2/9" in line:
                break
        else:
            pytest.fail("".join(seen[-50:]))
        run.send_signal(signal.SIGTERM)
        rest = run.stdout.read()
        assert run.wait(timeout=60) == 128 + signal.SIGTERM, rest[-3000:]
    assert "interrupted by SIGTERM: every process stopped" in rest
    assert _left_behind(tmp_path, run.pid) == []
