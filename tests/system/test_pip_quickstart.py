"""The README's pip quick start, run as written by a pip user: a fresh virtualenv, opledger
installed as a package (no editable install, no dev extra), then every command of the
block in one shell, against a database and a Redis of the test's own.

What is replaced, and only that: the package name becomes the wheel of this checkout's
working tree (the run's one build, `tests.packaging`: the sdist from the tracked files,
the wheel from the sdist; tests/system/test_wheel.py checks the same files), the two
exported URLs become the test's, and the sandbox gets free ports (the CRM adapter is told
them). Everything else runs verbatim, the processes it starts in the background included
(stopped at the end).

The virtualenv has the pip of the suite's own environment (a current one, as
`python -m venv --upgrade-deps` would give; the pip an interpreter bundles can be years
older, and took twice the CPU for the same install). Its shell is a pip user's: no
OPLEDGER_ setting and no PYTHONDONTWRITEBYTECODE of the suite's, and PIP_COMPILE=0: pip
byte-compiles nothing it installs, and the block's first process to import a module writes
its bytecode for the next ones (compiling every installed file cost more than compiling
what the block imports)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from opledger.dev.processes import PrivateRedis, free_port
from opledger.ledger import Ledger, Status
from opledger.ledger.connector import sqlalchemy_url
from opledger.ledger.pgschema import DEFAULT_SCHEMA
from tests.conftest import PostgresServer
from tests.packaging import built_dists

pytestmark = [pytest.mark.system, pytest.mark.own_processes]

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
HEADING = "## In your application (pip)"


def quickstart_block() -> str:
    """The first ```sh block under the pip quick start's heading, as written."""
    text_ = README.read_text()
    section = text_[text_.index(HEADING) :]
    found = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert found, f"no sh block under {HEADING!r}"
    return found.group(1)


@pytest.fixture
def scratch(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_pip")
    yield url
    pg_server.drop_database(url)


def _stop_group(proc: subprocess.Popen[str]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            proc.poll()
            time.sleep(0.1)


@pytest.mark.timeout(420)
def test_the_pip_quick_start_runs_as_written(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, scratch: str
) -> None:
    wheel = built_dists(tmp_path_factory).wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # the virtualenv's own pip (the block runs it), the version of the suite's, installed by
    # the suite's: no older pip bootstrapped first
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
            f"pip=={importlib.metadata.version('pip')}",
        ],
        check=True,
    )
    redis = PrivateRedis(tmp_path)
    redis.start()
    http, smtp = free_port(), free_port()
    block = quickstart_block()
    replacements = {
        "pip install 'opledger[": f"pip install --quiet '{wheel}[",
        "export OPLEDGER_DATABASE_URL=postgresql://app@127.0.0.1:5432/app": (
            f"export OPLEDGER_DATABASE_URL={scratch}"
        ),
        "export OPLEDGER_BROKER_URL=redis://127.0.0.1:6379/0": (
            f"export OPLEDGER_BROKER_URL={redis.url}"
        ),
        "opledger sandbox &": f"opledger sandbox --port {http} --smtp-port {smtp} &",
    }
    script = block
    for written, replacement in replacements.items():
        assert written in script, f"the block no longer says {written!r}"
        script = script.replace(written, replacement)
    # a pip user's shell: no OPLEDGER_ setting of the suite's (its schema included), no
    # PYTHONPATH or PYTHONDONTWRITEBYTECODE, the fresh virtualenv first on PATH, the
    # sandbox's ports for the CRM adapter; pip compiles nothing (PIP_COMPILE=0: note that
    # pip reads PIP_NO_COMPILE=1 as --compile), the block's processes write the bytecode
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OPLEDGER_") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        OPLEDGER_CRM_URL=f"http://127.0.0.1:{http}",
        OPLEDGER_STATE_DIR=str(tmp_path / "state"),
        PYTHONUNBUFFERED="1",
        PIP_COMPILE="0",
    )
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "quickstart.log"
    # into a file, not a pipe: the processes the block leaves running keep their output
    # open after the shell exits
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=360)
        finally:
            _stop_group(proc)
            redis.kill()
    output = log.read_text()
    assert proc.returncode == 0, output[-6000:]
    # what the block says it prints: the effect confirmed, and the operation listed so
    said = re.search(r"^confirmed (op_[0-9A-Z]{26})$", output, re.M)
    assert said, output[-4000:]
    assert said.group(1) in output[said.end() :] and "confirmed" in output[said.end() :]
    # installed as a package, not from the checkout the suite runs
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import opledger; print(opledger.__file__)"],
        cwd=work,  # as the block ran: not from a directory holding the checkout
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(venv) in where and str(REPO) not in where, where
    # in the default schema, nothing of it in public, and the act recorded once
    ledger = Ledger.from_url(scratch, schema=DEFAULT_SCHEMA)
    try:
        operations = ledger.list(tenant="acme")
        assert [(op.id, op.status) for op in operations] == [(said.group(1), Status.CONFIRMED)]
        assert len(ledger.history(said.group(1)).attempts) == 1
    finally:
        ledger.engine.dispose()
    engine = create_engine(sqlalchemy_url(scratch))
    try:
        with engine.connect() as conn:
            public = conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace")
            ).scalar_one()
        assert public == 0
    finally:
        engine.dispose()
