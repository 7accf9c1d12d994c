"""Running the real `opledger` command from a test, and what its output must look like
(one line per failure, 80 columns): shared by the CLI tests."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from opledger.ledger import Ambiguous, Ledger
from tests.conftest import SCHEMA

WRONG_PORT = "postgresql://root@127.0.0.1:1/test"
BROKER_DOWN = "redis://127.0.0.1:1/0"
BOX = re.compile("[\u2500-\u257f]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return self.err.strip().splitlines()

    def json(self) -> Any:
        return json.loads(self.out)  # the whole of stdout: one document, nothing else


def _env(database_url: str, **extra: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    ledger = {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_DATABASE_SCHEMA": SCHEMA}
    return env | ledger | {"COLUMNS": "80"} | extra


def cli(database_url: str, *args: str, **env: str) -> Run:
    """The real `opledger ARGS`, its output piped."""
    done = subprocess.run(
        [sys.executable, "-m", "opledger.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(database_url, **env),
    )
    return Run(done.returncode, done.stdout, done.stderr)


def cli_on_terminal(database_url: str, *args: str) -> Run:
    """The real `opledger ARGS`, stdout on a terminal 80 columns wide (colours removed)."""
    main, child = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "opledger.cli", *args],
        stdout=child,
        stderr=subprocess.PIPE,
        env=_env(database_url, TERM="xterm"),
    ) as process:
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal closed: the command has exited
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(main)
        assert process.stderr is not None
        err = process.stderr.read().decode()
        code = process.wait(timeout=60)
    out = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    return Run(code, out, err)


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def one_line_failure(run: Run, code: int, *names: str) -> None:
    """Exit `code`, one line on stderr naming what to fix, nothing on stdout."""
    assert run.code == code, (run.code, run.out, run.err)
    assert len(run.err_lines) == 1, run.err
    for name in names:
        assert name in run.err, (name, run.err)
    assert run.out == ""


def fits_80_columns(output: str) -> None:
    assert "\u2026" not in output  # nothing cut with an ellipsis
    assert max(len(line) for line in output.splitlines()) <= 80, output


def in_review(ledger: Ledger, key: str, payload: dict[str, Any]) -> str:
    """An operation whose only attempt was ambiguous, with an open review."""
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf-cli",
        intent_key=key,
        action="crm.close_case.v1",
        target=f"case-[bold]{key}",  # square brackets are shown, never read as markup
        payload=payload,
        authorization_ref="auth_acme",
    )
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    after = ledger.record_outcome(claim, Ambiguous(code="connection_lost", reason="lost"))
    assert ledger.open_review(op.id, fence=after.fence, reason="the response was lost")
    return op.id
