"""`opledger adapter new NAME`: a module that imports, whose registry loads beside the
bundled adapters, a test skeleton that runs; never an existing file overwritten."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from opledger.adapters.registry import load_registry
from opledger.cli.main import app
from opledger.settings import Settings


def _new(*args: str) -> Result:
    return CliRunner().invoke(app, ["adapter", "new", *args])


def test_the_skeleton_imports_its_registry_loads_and_its_test_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = tmp_path / "myapp"
    made = _new("tickets", "--dir", str(where))
    assert made.exit_code == 0, made.output
    assert "OPLEDGER_ADAPTERS=tickets:build_registry" in made.stdout
    assert sorted(p.name for p in where.iterdir()) == ["test_tickets.py", "tickets.py"]

    monkeypatch.syspath_prepend(str(where))
    monkeypatch.delitem(sys.modules, "tickets", raising=False)
    monkeypatch.setenv("TICKETS_URL", "http://127.0.0.1:9")
    registry = load_registry(Settings(adapters="tickets:build_registry"))
    try:
        assert "tickets.create.v1" in registry.actions
        assert "crm.close_case.v1" in registry.actions  # the bundled ones beside it
        assert registry.provider_for("tickets.create.v1") == "tickets"
    finally:
        registry.close()
        sys.modules.pop("tickets", None)

    # the generated test, as its author would run it: the registry test passes, the
    # contract check waits for a test endpoint
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPLEDGER_", "TICKETS_"))}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_tickets.py"],
        cwd=where,
        env={**env, "PYTHONPATH": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed, 1 skipped" in run.stdout, run.stdout


def test_inside_a_package_the_setting_names_the_package(tmp_path: Path) -> None:
    package = tmp_path / "myapp" / "providers"
    package.mkdir(parents=True)
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    made = _new("tickets", "--dir", str(package))
    assert made.exit_code == 0, made.output
    assert "OPLEDGER_ADAPTERS=myapp.providers.tickets:build_registry" in made.stdout
    assert "from myapp.providers.tickets import" in (package / "test_tickets.py").read_text()


def test_an_existing_file_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "tickets.py").write_text("# mine\n")
    refused = _new("tickets", "--dir", str(tmp_path))
    assert refused.exit_code == 3, refused.output
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "tickets.py already exists" in refused.stderr
    assert (tmp_path / "tickets.py").read_text() == "# mine\n"
    assert not (tmp_path / "test_tickets.py").exists()  # nothing written at all


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("Tickets", "not a lower-case Python name"),
        ("my-tickets", "not a lower-case Python name"),
        ("class", "keyword"),
        ("email", "already has"),  # it would hide the standard library's email
    ],
)
def test_a_name_that_cannot_be_a_module_is_refused(tmp_path: Path, name: str, why: str) -> None:
    refused = _new(name, "--dir", str(tmp_path))
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.count("\n") == 1 and why in refused.stderr, refused.stderr
    assert list(tmp_path.iterdir()) == []
