"""The package as a pip user gets it: `scripts/check_wheel.py` (also `make wheel`) builds
the sdist and the wheel, checks their metadata, installs the wheel in a fresh virtualenv
outside the checkout and runs it there (the CLI, every module, the migrations, templates
and static files). A system test: it runs beside the shared stack's tests, not before
the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_the_built_wheel_installs_and_runs_outside_the_checkout() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_wheel.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
