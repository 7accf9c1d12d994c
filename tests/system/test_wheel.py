"""The package as a pip user gets it: `scripts/check_wheel.py` (also `make wheel`) builds
the sdist and the wheel, checks their metadata, installs the wheel in a fresh virtualenv
outside the checkout and runs it there (the CLI, every module and example, `opledger
example`, the migrations, templates and static files). A system test: it runs beside the
shared stack's tests, not before the suite; it starts every process it needs itself
(`own_processes`: no shared stack idles beside it).

Then the LangGraph example as docs/agents.md gives it, from the wheel: a fresh virtualenv
with the wheel and its `[langgraph]` extra only (`pip install 'opledger[langgraph]'`), the
ledger migrated and a worker running from it (`opledger migrate`, `opledger worker`), a
broker (a private Redis) and the CRM and email API the bundled adapters call (the suite's
sandbox providers: what the example reaches, not what it installs); then the section's
first command, as written, from a directory outside the checkout. The example's chat
model is its own stand-in (no network): the run must end with the model's answer, every
effect confirmed, and each act once at the providers.

The build is the run's one build (`tests.packaging`: `check_wheel.py --build-only`, shared
with the pip quick start's test); `check_wheel.py --built` checks and installs it."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opledger.dev.processes import PrivateRedis, Proc, Process, Stack, free_port
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.ledger.pgschema import DEFAULT_SCHEMA
from tests.conftest import PostgresServer
from tests.packaging import CHECK_WHEEL, ROOT, built_dists

pytestmark = [pytest.mark.system, pytest.mark.own_processes]

AGENTS_DOC = ROOT / "docs" / "agents.md"
SECTION = "## The LangGraph example"
#: the example as installed: a module of the package, not a file of the checkout
INSTALLED = "python -m opledger.examples.langgraph_onboarding "
#: not passed on to the virtualenv's processes: the checkout's interpreter settings
NOT_PASSED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONDONTWRITEBYTECODE")


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


def documented_run() -> list[str]:
    """The first command of the LangGraph example's ```sh block, as written (its comment
    left out)."""
    text = AGENTS_DOC.read_text()
    section = text[text.index(SECTION) :]
    found = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert found, f"no sh block under {SECTION!r}"
    command = found.group(1).splitlines()[0].split("#", 1)[0].strip()
    assert command.startswith(INSTALLED), f"not the installed form: {command!r}"
    return shlex.split(command)


class Installed(Proc):
    """An `opledger` command of the virtualenv's (its console script, in the environment's
    VIRTUAL_ENV), in the state directory, its output in the log."""

    def _start(self, argv: list[str], env: dict[str, str], module: str) -> Process:
        return subprocess.Popen(
            [str(Path(env["VIRTUAL_ENV"]) / "bin" / "opledger"), *argv],
            env=env,
            cwd=env["OPLEDGER_STATE_DIR"],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def scratch(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_wheel")
    yield url
    pg_server.drop_database(url)


def _venv_with_langgraph(venv: Path, wheel: Path) -> None:
    """`pip install 'opledger[langgraph]'`, the wheel for the package name, by the suite's
    pip (no other pip bootstrapped), nothing byte-compiled (each process compiles what it
    imports, once)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-compile",
            "--disable-pip-version-check",
            f"{wheel}[langgraph]",
        ],
        check=True,
        capture_output=True,
    )


def _user_env(venv: Path, state: Path, **settings: str) -> dict[str, str]:
    """A pip user's shell: the virtualenv first on PATH, nothing of the checkout's, no
    OPLEDGER_ setting of the suite's; these settings."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_") and k not in NOT_PASSED
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        OPLEDGER_STATE_DIR=str(state),
        **settings,
    )
    return env


def _tool_answers(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The run ended with the model's final answer; each tool's answer by name."""
    assert state["next"] == [], state
    last = state["messages"][-1]
    assert last["type"] == "ai" and last["content"].startswith("Done:"), last
    return {m["name"]: json.loads(m["content"]) for m in state["messages"] if m["type"] == "tool"}


@pytest.mark.timeout(300)
def test_the_langgraph_example_runs_from_the_wheel_as_the_docs_say(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, scratch: str
) -> None:
    argv = documented_run()  # before anything is installed: the docs say it so, or stop
    wheel = built_dists(tmp_path_factory).wheel
    venv, state, work = tmp_path / "venv", tmp_path / "state", tmp_path / "work"
    state.mkdir()
    work.mkdir()
    _venv_with_langgraph(venv, wheel)
    redis = PrivateRedis(tmp_path)
    redis.start()
    with Sandbox(port=free_port(), smtp_port=free_port()) as providers:
        env = _user_env(
            venv,
            state,
            OPLEDGER_DATABASE_URL=scratch,
            OPLEDGER_BROKER_URL=redis.url,
            OPLEDGER_CRM_URL=providers.http_url,
            OPLEDGER_EMAIL_URL=providers.http_url,
        )
        assert shutil.which(argv[0], path=env["PATH"]) == str(venv / "bin" / argv[0])
        stack = Stack(env, tmp_path, proc=Installed)
        try:
            migrated = Installed("migrate", ["migrate"], env, tmp_path / "migrate.log")
            assert migrated.wait(120) == 0, migrated.output()
            stack.start_worker()  # `opledger worker` of the virtualenv, ready
            done = subprocess.run(
                argv, cwd=work, env=env, capture_output=True, text=True, timeout=180
            )
        finally:
            stack.stop_all()
            redis.kill()
        assert done.returncode == 0, done.stderr[-4000:]
        answers = _tool_answers(json.loads(done.stdout.strip().splitlines()[-1]))
        assert sorted(answers) == ["close_case", "email_owner", "tag_case"]
        assert {a["kind"] for a in answers.values()} == {"confirmed"}, answers
        assert not any(a["asked_before"] for a in answers.values())
        acts = providers.by_act()
    # each act once at the providers (the example's defaults: case-318, its owner), the
    # operations the thread's, confirmed
    assert acts == {
        "crm:acme:close:case-318": 1,
        "crm:acme:update:case-318": 1,
        "email:acme:owner@acme.test": 1,
    }
    run = f"langgraph:{argv[argv.index('--thread') + 1]}"
    ledger = Ledger.from_url(scratch, schema=DEFAULT_SCHEMA)
    try:
        operations = ledger.list(tenant="acme")
        assert sorted((o.action, o.workflow_id, o.status) for o in operations) == [
            ("crm.close_case.v1", run, Status.CONFIRMED),
            ("crm.update_case.v1", run, Status.CONFIRMED),
            ("email.send.v1", run, Status.CONFIRMED),
        ]
    finally:
        ledger.engine.dispose()
    # the example the command ran is the wheel's, in the virtualenv
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.util as u; "
            "print(u.find_spec('opledger.examples.langgraph_onboarding').origin)",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(venv) and not Path(where).is_relative_to(ROOT), where
