"""The package as a pip user gets it: `scripts/check_wheel.py` (also `make wheel`) builds
the sdist and the wheel, checks their metadata, installs the wheel in a fresh virtualenv
outside the checkout and runs it there (the CLI, every module, the migrations, templates
and static files). A system test: it runs beside the shared stack's tests, not before
the suite; it starts every process it needs itself (`own_processes`: no shared stack idles
beside it).

The build is the run's one build (`tests.packaging`: `check_wheel.py --build-only`, shared
with the pip quick start's test); `check_wheel.py --built` checks and installs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.packaging import CHECK_WHEEL, ROOT, built_dists

pytestmark = [pytest.mark.system, pytest.mark.own_processes]


@pytest.mark.timeout(600)
def test_the_built_wheel_installs_and_runs_outside_the_checkout(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    dists = built_dists(tmp_path_factory)
    run = subprocess.run(
        [sys.executable, str(CHECK_WHEEL), "--built", str(dists.directory)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
