"""Named crash points on the worker's path, for crash tests and chaos runs.

Armed per process by the environment: ``OPLEDGER_CRASHPOINT=name`` kills the process the
first time it reaches `name`, ``name:n`` the n-th time; several may be given, separated
by commas. An armed point sends SIGKILL to its own process: a real crash, no exception,
no cleanup, no broker ack. When nothing is armed, `reached` returns at once.

``OPLEDGER_CRASHPOINT_SIGNAL=SIGSTOP`` freezes the process there instead (a GC pause, a
VM freeze): it carries on where it stopped when someone sends it SIGCONT.
"""

from __future__ import annotations

import os
import signal

NAMES = (
    "dispatch.after_claim",  # the claim (and its attempt row) committed
    "dispatch.before_call",  # the adapter is chosen; the provider call is next
    "dispatch.after_call",  # the provider answered; the outcome is not saved yet
    "dispatch.after_save",  # the outcome is saved; the broker has not been acked
    "reconcile.before_lookup",
    "reconcile.after_lookup",  # the lookup answered; its evidence is not saved yet
    "relay.after_publish",  # messages published; not yet marked as enqueued
)


def _parse(spec: str) -> dict[str, int]:
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition(":")
        if name not in NAMES:
            raise ValueError(f"unknown crash point {name!r}; known: {', '.join(NAMES)}")
        armed[name] = int(nth) if nth else 1
    return armed


def _signal(name: str) -> signal.Signals:
    if name not in ("SIGKILL", "SIGSTOP"):
        raise ValueError(f"OPLEDGER_CRASHPOINT_SIGNAL must be SIGKILL or SIGSTOP, not {name!r}")
    return signal.Signals[name]


_armed: dict[str, int] | None = _parse(os.environ.get("OPLEDGER_CRASHPOINT", "")) or None
_sig = _signal(os.environ.get("OPLEDGER_CRASHPOINT_SIGNAL", "SIGKILL"))
_passes: dict[str, int] = {}


def reached(name: str) -> None:
    """Kill (or stop) this process if `name` is armed and this is its n-th pass."""
    if _armed is None or name not in _armed:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == _armed[name]:
        os.kill(os.getpid(), _sig)
