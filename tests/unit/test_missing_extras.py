"""A command whose extra is not installed ends in one line on stderr naming the extra to
install, and exit code 4; stdout stays empty (a `--json` reader sees nothing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: the CLI run with `missing` made unimportable (as in an install without its extra)
WITHOUT = """
import importlib.abc, sys
missing = {missing!r}
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == missing or name.startswith(missing + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Missing())
sys.argv = ["opledger", *{argv!r}]
from opledger.cli.main import main
main()
"""


@pytest.mark.parametrize(
    ("missing", "argv", "line"),
    [
        (
            "dbos",
            ["bench", "--agents", "--json"],
            "the agents bench needs the bench extra (dbos is missing): "
            "pip install 'opledger[bench]'",
        ),
        (
            "aiosmtpd",
            ["sandbox"],
            "the sandbox needs the sandbox extra (aiosmtpd is missing): "
            "pip install 'opledger[sandbox]'",
        ),
    ],
)
def test_a_missing_extra_is_one_line_on_stderr(missing: str, argv: list[str], line: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
    run = subprocess.run(
        [sys.executable, "-c", WITHOUT.format(missing=missing, argv=argv)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert run.returncode == 4, run.stderr
    assert run.stderr.strip() == line
    assert run.stdout == ""
