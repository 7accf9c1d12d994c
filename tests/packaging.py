"""The package's sdist and wheel, built once per test run for the tests that install it
(tests/system/test_wheel.py checks and installs both, and runs the LangGraph example's
documented command from a virtualenv with the wheel's `[langgraph]` extra;
tests/system/test_pip_quickstart.py installs the wheel as the README's pip user would).

`scripts/check_wheel.py --build-only DIR` builds them (from a copy of the working tree's
files: the sdist, then the wheel from the unpacked sdist, in an isolated build
environment). The run's pytest-xdist processes may ask at the same time: the first takes an
exclusive lock on a file in the run's temporary directory (which they share) and builds,
the others wait for the lock and take what it built, or the same failure."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECK_WHEEL = ROOT / "scripts" / "check_wheel.py"


@dataclass(frozen=True)
class Dists:
    directory: Path  # the two files and nothing else (`check_wheel.py --built DIR`)
    sdist: Path
    wheel: Path


def _run_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This test run's temporary directory: under pytest-xdist each process has its own
    (`popen-gwN`) inside the run's, which they share."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The run's sdist and wheel, built by the first caller; a failed build fails every
    caller with its output."""
    shared = _run_directory(tmp_path_factory) / "opledger-dists"
    shared.mkdir(exist_ok=True)
    directory, outcome = shared / "dist", shared / "outcome.json"
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not outcome.exists():
            shutil.rmtree(directory, ignore_errors=True)  # a build that died half way
            done = subprocess.run(
                [sys.executable, str(CHECK_WHEEL), "--build-only", str(directory)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
            )
            said = done.stdout[-4000:] + done.stderr[-4000:]
            outcome.write_text(json.dumps({"returncode": done.returncode, "output": said}))
        result = json.loads(outcome.read_text())
    assert result["returncode"] == 0, f"check_wheel.py --build-only failed:\n{result['output']}"
    (sdist,) = directory.glob("*.tar.gz")
    (wheel,) = directory.glob("*.whl")
    return Dists(directory, sdist, wheel)
