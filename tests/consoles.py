"""Shared by the console's tests: the real `opledger` command, and a running `opledger
console` process until it answers its health check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from opledger.dev.processes import Proc, free_port, wait_until


def opledger(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """`opledger ARGS` in a process of its own, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "opledger.cli", *args],
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@contextmanager
def running_console(env: dict[str, str], log: Path, *args: str) -> Iterator[str]:
    """`opledger console ARGS` on a free port, once it answers; yields its base URL and
    stops it on exit."""
    port = free_port()
    proc = Proc("console", ["console", "--port", str(port), *args], env, log)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.proc.poll() is not None:
            raise AssertionError(f"the console died:\n{proc.output()}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 30, "the console to answer")
        yield url
    finally:
        proc.stop()
