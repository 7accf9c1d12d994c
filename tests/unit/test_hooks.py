"""The worker's boundaries (`tasks.hooks`): each crash point (`dev.crashpoints`) is reached
exactly where its name says and only when its boundary ended normally; `All` opens
observers in order and tells each one everything; a production worker's hooks have no
crash points, and only development mode arms them."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from opledger.cli import devmode
from opledger.dev import crashpoints
from opledger.observability import metrics
from opledger.tasks import hooks
from opledger.tasks.hooks import All, Hooks, Watch

Reached = list[str]


class Points(crashpoints.CrashPoints):
    """Every point armed, each pass written down instead of killing the process."""

    def __init__(self, reached: Reached) -> None:
        super().__init__(dict.fromkeys(crashpoints.NAMES, 1))
        self.seen = reached

    def reached(self, name: str) -> None:
        self.seen.append(name)


@pytest.fixture
def reached() -> Reached:
    return []


@pytest.fixture
def points(reached: Reached) -> Points:
    return Points(reached)


class _Claim:
    op_id = "op_01J00000000000000000000000"

    class operation:  # what a Claim's operation carries, for the hooks
        provider = "crm"


CLAIM: Any = _Claim()


def test_a_dispatch_claim_reaches_after_claim_only_when_taken(
    points: Points, reached: Reached
) -> None:
    with points.claim("op_x"):
        pass  # not claimable: nothing
    with points.claim("op_x", retry=True) as watch:
        watch.claim(CLAIM)  # reconcile's retry claim has no crash point
    assert reached == []
    with points.claim("op_x") as watch:
        watch.claim(CLAIM)
    assert reached == ["dispatch.after_claim"]


def test_the_call_reaches_before_only_when_sending_and_after_only_on_a_normal_end(
    points: Points, reached: Reached
) -> None:
    with points.call(CLAIM, "crm"):
        pass  # the send-by window had passed: nothing was sent
    assert reached == ["dispatch.after_call"]
    reached.clear()
    with points.call(CLAIM, "crm") as watch:
        watch.sending()
        assert reached == ["dispatch.before_call"]
    assert reached == ["dispatch.before_call", "dispatch.after_call"]
    reached.clear()
    with pytest.raises(RuntimeError), points.call(CLAIM, "crm") as watch:
        watch.sending()
        raise RuntimeError("the worker's own bug")
    assert reached == ["dispatch.before_call"]


def test_after_save_only_for_a_provider_outcome_that_was_saved(
    points: Points, reached: Reached
) -> None:
    with points.record("op_x", 1, "provider", "crm") as watch:
        watch.fenced()
    with points.record("op_x", 1, "evidence", "crm"):
        pass
    assert reached == []
    with points.record("op_x", 1, "provider", "crm"):
        pass
    assert reached == ["dispatch.after_save"]


def test_a_lookup_is_bracketed_by_its_crash_points(points: Points, reached: Reached) -> None:
    with points.lookup(CLAIM.operation) as _:
        assert reached == ["reconcile.before_lookup"]
    assert reached == ["reconcile.before_lookup", "reconcile.after_lookup"]


def test_the_relay_reaches_its_point_through_the_hooks(points: Points, reached: Reached) -> None:
    hooks.HOOKS.relayed()  # a production worker's relay: nothing
    crashpoints.worker_hooks(points).relayed()
    assert reached == ["relay.after_publish"]


def test_a_point_fires_on_its_nth_pass_only(monkeypatch: pytest.MonkeyPatch) -> None:
    killed: list[tuple[int, Any]] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    points = crashpoints.from_environ(
        {"OPLEDGER_CRASHPOINT": "relay.after_publish:2", "OPLEDGER_CRASHPOINT_SIGNAL": "SIGSTOP"}
    )
    assert points is not None
    points.relayed()
    assert killed == []
    points.relayed()
    points.relayed()
    assert [sig for _, sig in killed] == [signal.SIGSTOP]
    assert crashpoints.from_environ({}) is None
    with pytest.raises(ValueError, match=r"unknown crash point 'dispatch\.nowhere'"):
        crashpoints.from_environ({"OPLEDGER_CRASHPOINT": "dispatch.nowhere"})


class _Recorder(Hooks):
    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    @contextmanager
    def decide(self, op_id: str) -> Iterator[Watch]:
        self.log.append(f"{self.name} opens")
        recorder = self

        class Told(Watch):
            def decision(self, decision: Any, lookups: int) -> None:
                recorder.log.append(f"{recorder.name} told {decision} after {lookups}")

        yield Told()
        self.log.append(f"{self.name} closes")

    def fenced_out(self, where: str) -> None:
        self.log.append(f"{self.name} fenced out at {where}")


def test_all_opens_in_order_closes_in_reverse_and_tells_everyone() -> None:
    log: list[str] = []
    both = All(_Recorder("outer", log), _Recorder("inner", log))
    with both.decide("op_x") as watch:
        watch.decision("Wait", 2)
        watch.verdict("absent")  # nobody listens: ignored
    both.fenced_out("reconcile")
    assert log == [
        "outer opens",
        "inner opens",
        "outer told Wait after 2",
        "inner told Wait after 2",
        "inner closes",
        "outer closes",
        "outer fenced out at reconcile",
        "inner fenced out at reconcile",
    ]


def test_a_production_worker_has_no_crash_points_and_a_development_one_has_them_outermost(
    points: Points,
) -> None:
    assert isinstance(hooks.HOOKS, All)
    assert [type(h).__name__ for h in hooks.HOOKS.hooks] == ["Tracing", "Metrics"]
    armed = crashpoints.worker_hooks(points)
    assert isinstance(armed, All)
    assert [type(h).__name__ for h in armed.hooks] == ["Points", "Tracing", "Metrics"]


def test_only_development_mode_arms_crash_points() -> None:
    armed = {"OPLEDGER_CRASHPOINT": "dispatch.after_call"}
    assert devmode.crash_hooks({}, dev=False) is None
    assert devmode.crash_hooks({"OPLEDGER_CRASHPOINT": " "}, dev=True) is None
    with pytest.raises(devmode.CrashPointsOutsideDev, match="OPLEDGER_DEV=1"):
        devmode.crash_hooks(armed, dev=False)
    dev_hooks = devmode.crash_hooks(armed, dev=True)
    assert isinstance(dev_hooks, All)
    first = dev_hooks.hooks[0]
    assert isinstance(first, crashpoints.CrashPoints)
    assert first.armed == {"dispatch.after_call": 1}


def test_only_a_dispatch_that_returned_is_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    observed: list[tuple[str, float]] = []

    class Histogram:
        def labels(self, provider: str) -> Any:
            return type("H", (), {"observe": lambda _, s: observed.append((provider, s))})()

    monkeypatch.setattr(metrics, "PROVIDER_LATENCY", Histogram())
    with hooks.Metrics().call(CLAIM, "crm:acme") as watch:
        watch.sending()  # the adapter raised: no answered(), nothing timed
        watch.outcome("ambiguous")
    assert observed == []
    with hooks.Metrics().call(CLAIM, "crm:acme") as watch:
        watch.sending()
        watch.answered()
    assert [p for p, _ in observed] == ["crm:acme"]
