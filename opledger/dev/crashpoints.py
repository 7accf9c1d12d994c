"""Named crash points on the worker's path, for crash tests and chaos runs: development
tooling, never part of a production worker.

A worker arms them only in development mode, through the CLI's door (`cli.devmode`):
``OPLEDGER_DEV=1 OPLEDGER_CRASHPOINT=name opledger worker`` kills the process the first
time it reaches `name`, ``name:n`` the n-th time; several may be given, separated by
commas. An armed point sends SIGKILL to its own process: a real crash, no exception, no
cleanup, no broker ack. ``OPLEDGER_CRASHPOINT_SIGNAL=SIGSTOP`` freezes the process there
instead (a GC pause, a VM freeze): it carries on where it stopped when someone sends it
SIGCONT. `opledger worker` with `OPLEDGER_CRASHPOINT` but without `OPLEDGER_DEV=1`
refuses to start.

`CrashPoints` is an observer of the worker's boundaries (`tasks.hooks`), like traces and
metrics: each point is reached where its name says, and only when its boundary ended
normally.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opledger.ledger import Claim, Operation
from opledger.tasks.hooks import NOWATCH, All, Hooks, Metrics, Tracing, Watch

NAMES = (
    "dispatch.after_claim",  # the claim (and its attempt row) committed
    "dispatch.before_call",  # the adapter is chosen; the provider call is next
    "dispatch.after_call",  # the provider answered; the outcome is not saved yet
    "dispatch.after_save",  # the outcome is saved; the broker has not been acked
    "reconcile.before_lookup",
    "reconcile.after_lookup",  # the lookup answered; its evidence is not saved yet
    "relay.after_publish",  # messages published; not yet marked as enqueued
)

#: the variables that arm them
VARIABLE = "OPLEDGER_CRASHPOINT"
SIGNAL_VARIABLE = "OPLEDGER_CRASHPOINT_SIGNAL"


def parse(spec: str) -> dict[str, int]:
    """`name[:n],...` as {name: n}; an unknown name is a ValueError naming the known ones."""
    armed: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition(":")
        if name not in NAMES:
            raise ValueError(f"unknown crash point {name!r}; known: {', '.join(NAMES)}")
        armed[name] = int(nth) if nth else 1
    return armed


def _signal(name: str) -> signal.Signals:
    if name not in ("SIGKILL", "SIGSTOP"):
        raise ValueError(f"{SIGNAL_VARIABLE} must be SIGKILL or SIGSTOP, not {name!r}")
    return signal.Signals[name]


class _Seen(Watch):
    """Remembers whether a claim was taken or the write refused."""

    def __init__(self) -> None:
        self.claimed = self.refused = False

    def claim(self, claim: Claim) -> None:
        self.claimed = True

    def fenced(self) -> None:
        self.refused = True


class _BeforeCall(Watch):
    def __init__(self, points: CrashPoints) -> None:
        self.points = points

    def sending(self) -> None:
        self.points.reached("dispatch.before_call")


class CrashPoints(Hooks):
    """The named crash points, each reached where its name says: after a dispatch's claim,
    before and after the provider call, after its outcome is saved, before and after a
    lookup, after the relay published. Only a boundary that ended normally reaches its
    "after". `armed`: {name: the pass that fires}; `sig`: what it sends its own process."""

    def __init__(self, armed: Mapping[str, int], sig: signal.Signals = signal.SIGKILL) -> None:
        self.armed = dict(armed)
        self.sig = sig
        self.passes: dict[str, int] = {}

    def reached(self, name: str) -> None:
        """Kill (or stop) this process if `name` is armed and this is its n-th pass."""
        if name not in self.armed:
            return
        self.passes[name] = self.passes.get(name, 0) + 1
        if self.passes[name] == self.armed[name]:
            os.kill(os.getpid(), self.sig)

    @contextmanager
    def claim(self, op_id: str, *, retry: bool = False) -> Iterator[Watch]:
        seen = _Seen()
        yield seen
        if seen.claimed and not retry:
            self.reached("dispatch.after_claim")

    @contextmanager
    def call(self, claim: Claim, provider: str) -> Iterator[Watch]:
        yield _BeforeCall(self)
        self.reached("dispatch.after_call")

    @contextmanager
    def record(self, op_id: str, fence: int, source: str, provider: str) -> Iterator[Watch]:
        seen = _Seen()
        yield seen
        if source == "provider" and not seen.refused:
            self.reached("dispatch.after_save")

    @contextmanager
    def lookup(self, op: Operation) -> Iterator[Watch]:
        self.reached("reconcile.before_lookup")
        yield NOWATCH
        self.reached("reconcile.after_lookup")

    def relayed(self) -> None:
        self.reached("relay.after_publish")


def from_environ(environ: Mapping[str, str] | None = None) -> CrashPoints | None:
    """The crash points `OPLEDGER_CRASHPOINT` arms (None: none), with the signal
    `OPLEDGER_CRASHPOINT_SIGNAL` names. A ValueError names what is wrong."""
    env = os.environ if environ is None else environ
    armed = parse(env.get(VARIABLE, ""))
    if not armed:
        return None
    return CrashPoints(armed, _signal(env.get(SIGNAL_VARIABLE, "SIGKILL")))


def worker_hooks(points: CrashPoints) -> Hooks:
    """A development worker's hooks: crash points outermost (a span ends before its
    crash), then traces and metrics, as in production (`tasks.hooks.HOOKS`)."""
    return All(points, Tracing(), Metrics())
