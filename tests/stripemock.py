"""stripe-stateful-mock, the Stripe test double the Stripe tests run against.

A stateful Stripe v1 server (npm `stripe-stateful-mock`, pinned in
`tests/stripe_mock/package-lock.json`) that stores idempotency keys with the first response
and replays it (`Idempotent-Replayed: true`), refuses other parameters under a used key
(`idempotency_error`), and serves charges and refunds with their list endpoints. It has no
PaymentIntents, no Search and no fault switches: faults come from `FaultProxy` in front of
it, and the tests count charges and refunds from its own list endpoints.

`npm ci` installs it into `.opledger/npm/stripe-mock` (gitignored) the first time; without
node and npm the tests are skipped on a laptop and fail in CI.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from opledger.dev.processes import free_port, wait_until

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "tests" / "stripe_mock"
PREFIX = REPO / ".opledger" / "npm" / "stripe-mock"
#: a test-mode key: the mock accepts any `sk_test_` key (and refuses others with a 401)
API_KEY = "sk_test_opledger_mock"


def require_node() -> None:
    """Skip when node or npm is missing: a skip on a laptop, a failure in CI."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        why = f"{' and '.join(missing)} not installed: stripe-stateful-mock needs Node.js"
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)


def install() -> Path:
    """The mock's entry point, installed with `npm ci` from the committed lock file when
    the installed copy is missing or was installed from another lock file."""
    require_node()
    PREFIX.mkdir(parents=True, exist_ok=True)
    cli = PREFIX / "node_modules" / "stripe-stateful-mock" / "dist" / "cli.js"
    lock = (SOURCE / "package-lock.json").read_bytes()
    with (PREFIX / ".install.lock").open("w") as guard:  # two pytest processes at once
        fcntl.flock(guard, fcntl.LOCK_EX)
        installed = PREFIX / "node_modules" / ".opledger-lock.json"
        if cli.exists() and installed.exists() and installed.read_bytes() == lock:
            return cli
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(SOURCE / name, PREFIX / name)
        done = subprocess.run(
            ["npm", "ci", "--prefix", str(PREFIX), "--ignore-scripts", "--no-audit", "--no-fund"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0 or not cli.exists():
            raise RuntimeError(f"npm ci of stripe-stateful-mock failed:\n{done.stderr[-2000:]}")
        installed.write_bytes(lock)
    return cli


class StripeMock:
    """One stripe-stateful-mock process on a free loopback port."""

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> StripeMock:
        cli = install()
        self.port = free_port()
        env = {**os.environ, "PORT": str(self.port), "LOG_LEVEL": "warn"}
        self._proc = subprocess.Popen(
            ["node", str(cli)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_until(self._answers, 30, "stripe-stateful-mock to answer", every=0.1)
        return self

    def _answers(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise RuntimeError(f"stripe-stateful-mock exited with {self._proc.returncode}")
        try:
            httpx.get(f"{self.url}/", headers=self.auth, timeout=1)
        except httpx.HTTPError:
            return False
        return True

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    # -- ground truth: the mock's own list endpoints ---------------------------------------

    def listed(self, path: str, **params: str) -> list[dict[str, Any]]:
        """Every object a list endpoint returns, all pages."""
        objects: list[dict[str, Any]] = []
        after: str | None = None
        with httpx.Client(base_url=self.url, headers=self.auth, timeout=10) as client:
            while True:
                query = {**params, "limit": "100", **({"starting_after": after} if after else {})}
                page = client.get(path, params=query)
                page.raise_for_status()
                body = page.json()
                objects += body["data"]
                if not body.get("has_more") or not body["data"]:
                    return objects
                after = body["data"][-1]["id"]

    def charges(self, marker: str | None = None, status: str = "succeeded") -> list[dict[str, Any]]:
        """Charges in `status` (all, with status ""), those marked with `marker` if given
        (an operation's `marker`, its first key: what the adapter writes, not its id)."""
        return [
            c
            for c in self.listed("/v1/charges")
            if (not status or c.get("status") == status)
            and (marker is None or c.get("metadata", {}).get("opledger_op") == marker)
        ]

    def refunds(self, charge: str | None = None, marker: str | None = None) -> list[dict[str, Any]]:
        params = {"charge": charge} if charge else {}
        return [
            r
            for r in self.listed("/v1/refunds", **params)
            if marker is None or r.get("metadata", {}).get("opledger_op") == marker
        ]

    def post(self, path: str, data: dict[str, str], key: str | None = None) -> httpx.Response:
        """A request of someone else's, straight to the mock."""
        headers = {**self.auth, **({"Idempotency-Key": key} if key else {})}
        return httpx.post(f"{self.url}{path}", data=data, headers=headers, timeout=10)


def stripe_mock() -> Iterator[StripeMock]:
    """A fixture body: the mock started, and stopped afterwards."""
    mock = StripeMock().start()
    try:
        yield mock
    finally:
        mock.stop()
