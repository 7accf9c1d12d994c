"""The newcomer path: the demo's entry point from a clean clone, with no service URLs set,
on its own embedded Postgres and Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opledger.dev.chaos.stack import Stack

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_the_demo_runs_from_a_clean_clone_with_zero_duplicates(
    stack: Stack, tmp_path: Path
) -> None:
    stack.stop_all()  # the demo brings its own services
    clone = tmp_path / "clone"
    if (REPO / ".git").exists():
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    else:  # not a git checkout: the tree as it is
        clone = REPO
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
    env.update(PYTHONPATH=str(clone), COLUMNS="200", OPLEDGER_STATE_DIR=str(tmp_path / "state"))
    where = subprocess.run(
        [sys.executable, "-c", "import opledger; print(opledger.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip().startswith(str(clone))
    run = subprocess.run(
        [sys.executable, "-m", "opledger.cli", "demo", "--json"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=380,
    )
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-4000:])
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["duplicate_effects"] == 0
    assert summary["dispatches_while_in_flight"] == 0
    assert summary["stuck"] == 0 and summary["lost"] == 0
    assert summary["ops"] >= 14
    assert "the story" in run.stdout and "Redis restarted" in run.stdout
    assert "Postgres restarted" in run.stdout  # it owned its embedded Postgres, so it could
