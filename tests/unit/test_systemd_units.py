"""deploy/systemd: the unit examples beside the compose file. systemd does not run here, so
check what can be checked: each unit starts a real `opledger` command whose options parse,
the environment file names only real settings, exactly one beat, everything after the
migration, and `systemd-analyze verify` (where it is installed) finds nothing wrong."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from opledger.cli.main import app
from opledger.settings import Settings

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
BINARY = "/opt/opledger/venv/bin/opledger"  # where the examples install opledger
#: variables the environment file may set that are not opledger settings
OTHERS = {"PROMETHEUS_MULTIPROC_DIR"}


def _unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNITS / name)
    return parser


def _services() -> list[str]:
    return sorted(p.name for p in UNITS.glob("*.service"))


def test_the_examples_are_there() -> None:
    assert set(_services()) == {
        "opledger-beat.service",
        "opledger-console.service",
        "opledger-metrics.service",
        "opledger-migrate.service",
        "opledger-worker@.service",
    }


@pytest.mark.parametrize("name", _services())
def test_each_unit_runs_a_real_command_whose_options_parse(name: str) -> None:
    unit = _unit(name)
    words = shlex.split(unit["Service"]["ExecStart"].replace("%i", "1").replace("%H", "host"))
    assert words[0] == BINARY
    group: Any = typer.main.get_command(app)
    command = group.commands[words[1]]
    command.make_context(words[1], words[2:])  # raises on an unknown option or a bad value
    assert unit["Service"]["EnvironmentFile"] == "/etc/opledger/opledger.env"
    assert unit["Service"]["User"] == "opledger"
    if name != "opledger-migrate.service":
        assert "opledger-migrate.service" in unit["Unit"]["Requires"]
        assert "opledger-migrate.service" in unit["Unit"]["After"]
        assert unit["Service"]["Restart"] == "on-failure"


def test_the_beat_is_one_unit_and_the_worker_a_template() -> None:
    assert "@" not in "opledger-beat.service"
    assert _unit("opledger-worker@.service")["Service"]["ExecStart"].count("%i") == 1
    assert _unit("opledger-migrate.service")["Service"]["Type"] == "oneshot"
    # a worker's warm shutdown outlasts the task time limit the environment file sets
    limit = float(_environment()["OPLEDGER_TASK_TIME_LIMIT_SECONDS"])
    assert float(_unit("opledger-worker@.service")["Service"]["TimeoutStopSec"]) > limit


def _environment() -> dict[str, str]:
    pairs = {}
    for line in (UNITS / "opledger.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key] = value
    return pairs


def test_the_environment_file_names_real_settings_that_validate() -> None:
    env = _environment()
    fields = {f"OPLEDGER_{name.upper()}" for name in Settings.model_fields}
    assert set(env) - OTHERS <= fields, set(env) - OTHERS - fields
    settings = Settings.from_environ({k: v for k, v in env.items() if k not in OTHERS})
    assert settings.database_schema == "opledger"
    assert settings.adapters.partition(":")[2]  # module:function


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_each_unit(tmp_path: Path) -> None:
    opledger = Path(sys.executable).with_name("opledger")
    for name in _services():
        text = (UNITS / name).read_text().replace(BINARY, str(opledger))
        (tmp_path / name).write_text(text)
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # units it cannot find (postgresql.service, the network target on a container) are no
    # fault of these files; anything else is
    problems = [
        line
        for line in verified.stderr.splitlines()
        if line.strip() and "not found" not in line and "No such file" not in line
    ]
    assert not problems, verified.stderr
