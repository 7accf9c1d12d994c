"""Simulated providers as real servers on loopback, for tests, the demo and chaos runs.

`Sandbox` starts them in a subprocess and talks to their admin endpoints.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import TracebackType
from typing import Any

import httpx


class Sandbox:
    """The sandbox providers in a child process: `with Sandbox() as sb: sb.http_url ...`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        smtp_port: int = 0,
        log: str | None = None,
        keepalive_timeout: float = 5.0,
    ) -> None:
        """`log`: a file for the providers' own log (injected faults log tracebacks).
        `keepalive_timeout`: how long the server keeps an idle connection open."""
        self._log = log
        self._args = [
            *("--host", host, "--port", str(port), "--smtp-port", str(smtp_port)),
            *("--keepalive-timeout", str(keepalive_timeout)),
        ]
        self._proc: subprocess.Popen[str] | None = None
        self.http_url = ""
        self.smtp_host = host
        self.smtp_port = 0
        self._client: httpx.Client | None = None
        self._log_file: Any = None
        self._pid = 0

    def start(self) -> Sandbox:
        self._log_file = open(self._log, "ab") if self._log else None  # noqa: SIM115
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "opledger.dev.sandbox", *self._args],
            stdout=subprocess.PIPE,
            stderr=self._log_file or subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._pid = self._proc.pid
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the sandbox providers did not start")
        info = json.loads(line)
        self.http_url, self.smtp_host, self.smtp_port = (
            info["http"],
            info["smtp_host"],
            info["smtp_port"],
        )
        self._client = httpx.Client(base_url=self.http_url, timeout=10)
        for _ in range(100):
            try:
                self._client.get("/_admin/truth")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        if self._log_file is not None:
            self._log_file.close()

    def detach(self) -> int:
        """Leave the providers running after this process exits; their process id."""
        assert self._proc is not None, "start the sandbox first"
        self._proc = None if self._proc.poll() is None else self._proc
        return self._pid

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- admin ------------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._client is not None, "start the sandbox first"
        response = self._client.post(path, json=body or {})
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def reset(self) -> None:
        """Forget everything: keys, cases, messages, faults, counters; default config."""
        self._post("/_admin/reset")

    def restart(self) -> int:
        """The providers restart: accounts without durable keys forget them all."""
        return int(self._post("/_admin/restart")["keys_forgotten"])

    def configure(self, account: str | None = None, **settings: Any) -> dict[str, Any]:
        """Switch protections and knobs (see `opledger.dev.sandbox.state.Config`), for one
        account or (without `account`) for every account without its own settings; e.g.
        the account's limits on writes: `configure("acme", max_concurrent=2,
        rate_per_s=20, burst=2)` (0: unlimited)."""
        body = {**settings, **({"account": account} if account is not None else {})}
        return self._post("/_admin/config", body)

    def fault(
        self,
        provider: str,
        mode: str,
        *,
        times: int = 1,
        delay_s: float = 0.0,
        key: str | None = None,
    ) -> None:
        """Inject a fault into the next `times` matching requests (modes:
        `opledger.dev.sandbox.state.FAULT_MODES`). "overloaded" (CRM and email only)
        answers a 503 with `Retry-After: <delay_s>` before anything is read or applied."""
        self._post(
            "/_admin/faults",
            {"provider": provider, "mode": mode, "times": times, "delay_s": delay_s, "key": key},
        )

    def close_by_other(self, account: str, case_id: str) -> None:
        """Someone else closes the case (not through opledger)."""
        self._post(f"/_admin/crm/{account}/cases/{case_id}/close_by_other")

    def truth(self) -> dict[str, Any]:
        """Ground truth: effects applied per key (`effects`) and per act (`by_act`), every
        request admitted per key (`requests`), and per account what its front door
        admitted and refused (`limited`, see `limited`)."""
        assert self._client is not None, "start the sandbox first"
        result: dict[str, Any] = self._client.get("/_admin/truth").json()
        return result

    def limited(self, account: str) -> dict[str, Any]:
        """What `account`'s front door did with its write requests (CRM case actions and
        email sends; one account name's CRM and email share it): `admitted`; `over_limit`
        (answered 429: `over_concurrency` + `over_rate`); `overloaded` (answered 503 by the
        "overloaded" fault); `in_flight` now and `max_in_flight` at the peak (admitted
        requests executing at once); `first_admitted_at` and `last_admitted_at` (Unix
        times, None before the first). All zero for an account that sent nothing."""
        from .state import Limiter  # the shape of a report, for an account never seen

        report: dict[str, Any] | None = self.truth()["limited"].get(account)
        return report if report is not None else Limiter().report()

    def by_act(self) -> dict[str, int]:
        """Effects applied per business act, whatever key carried them: a CRM verb on a
        case (`crm:<account>:<verb>:<case>`), an email to a recipient
        (`email:<account>:<to>`)."""
        return {k: int(v) for k, v in self.truth()["by_act"].items()}

    def effects(self, effect: str) -> int:
        """How many times `effect` (e.g. 'crm:op_...') was applied."""
        return int(self.truth()["effects"].get(effect, 0))
