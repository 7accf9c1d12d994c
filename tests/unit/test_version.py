"""The version is written once (`opledger.__version__`); the installed metadata and the
`opledger --version` command say the same."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import opledger

REPO = Path(__file__).resolve().parents[2]


def test_the_version_is_written_only_in_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "opledger.__version__"}


def test_the_installed_metadata_is_the_packages_version() -> None:
    # an editable install made before __version__ changed says the old one: reinstall
    assert version("opledger") == opledger.__version__


def test_opledger_version_prints_it() -> None:
    script = Path(sys.executable).parent / "opledger"
    done = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"opledger {opledger.__version__}\n"
