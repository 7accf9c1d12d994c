"""The contract check's fault probes: what only an endpoint that can inject faults lets
`opledger contract check` observe, through the sandbox's admin routes (`/_admin/...`).

- `after_error`: a failure after the change (applied, then a 500), and the same key again;
- `keys_durable`: a request, a restart, and the same key again;
- two requests with one key held long enough to overlap (`concurrent`).

`SandboxFaults` is the `FaultProbes` that `opledger.adapters.check.check_contract` takes;
`opledger contract check --admin-url URL` hands it one (through `opledger.cli.dev`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx

from opledger.adapters.base import extra
from opledger.adapters.check import (
    Finding,
    ProbeSession,
    Verdict,
    applied_twice,
    faults_not_observable,
    seen,
)
from opledger.ledger import Ambiguous, Confirmed
from opledger.ledger.contract import Contract


class SandboxFaults:
    """The sandbox at `admin_url` injects the faults; `delay_s`: how long each request of
    the concurrency probe executes, so that two overlap (0: as fast as it can)."""

    def __init__(self, admin_url: str, *, delay_s: float = 0.5) -> None:
        self.admin_url, self.delay_s = admin_url, delay_s

    @contextlib.contextmanager
    def overlapping(self, session: ProbeSession) -> Iterator[float]:
        if not self.delay_s:
            yield 0.0
            return
        account = str(extra(session.adapter, "account") or "")
        self._post("/_admin/config", {"account": account, "processing_s": self.delay_s})
        try:
            yield self.delay_s
        finally:
            self._post("/_admin/config", {"account": account, "processing_s": 0.0})

    def facts(self, session: ProbeSession, contract: Contract) -> list[Finding]:
        try:
            return [self._after_error(session, contract), self._keys_durable(session, contract)]
        except httpx.HTTPError as exc:
            why = f"{self.admin_url} cannot inject them ({_admin_error(exc)})"
            return faults_not_observable(contract, why)

    def _after_error(self, s: ProbeSession, contract: Contract) -> Finding:
        """A failure after the change, then the same key again: replayed, or released?"""
        idem = contract.idempotency
        key = s.key()
        mode = "error_after_commit"
        self._post("/_admin/faults", {"provider": _provider(s), "mode": mode, "key": key})
        failed = s.send(s.claim(key))
        again = s.send(s.claim(key))
        if isinstance(again, Confirmed) and not again.detail.get("replayed"):
            observed = "key_released"  # the change was applied again under the same key
        elif isinstance(again, Ambiguous) and (again.replayed or again.detail.get("replayed")):
            observed = "replayed"
        else:
            observed = f"unclear ({seen(failed)}; then {seen(again)})"
        verdict: Verdict = (
            "agrees"
            if observed == idem.after_error
            else "not observed"
            if observed.startswith("unclear")
            else "disagrees"
        )
        # a provider that applies atomically never shows a change behind a 5xx: the fault
        # injected here (applied, then 500) is exactly what such a contract denies
        if idem.after_error in ("nothing_applied", "rerun_failed") and observed in (
            "replayed",
            "key_released",
        ):
            verdict = "disagrees"
        return Finding(
            fact="after_error", declared=idem.after_error, observed=observed, verdict=verdict
        )

    def _keys_durable(self, s: ProbeSession, contract: Contract) -> Finding:
        """A request, a restart, the same key again: answered from the key, or applied?"""
        durable = contract.idempotency.keys_durable
        key = s.key()
        first = s.send(s.claim(key))
        self._post("/_admin/restart", {})
        after = s.send(s.claim(key))
        lost = applied_twice(first, after)
        if lost is None:
            return Finding(
                fact="keys_durable",
                declared=str(durable).lower(),
                observed=f"{seen(first)}; after a restart {seen(after)}",
                verdict="not observed",
            )
        return Finding(
            fact="keys_durable",
            declared=str(durable).lower(),
            observed="the key was forgotten" if lost else "the key survived",
            verdict="agrees" if lost != durable else "disagrees",
        )

    def _post(self, path: str, body: dict[str, Any]) -> None:
        response = httpx.post(self.admin_url.rstrip("/") + path, json=body, timeout=10)
        response.raise_for_status()


def _provider(s: ProbeSession) -> str:
    """The sandbox's name for the provider behind the adapter ("crm", "email")."""
    action, _, _ = s.probe(0)
    return action.split(".", 1)[0]


def _admin_error(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from {exc.request.url.path}"
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
