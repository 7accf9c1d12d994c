"""The worker's boundaries (`tasks.hooks`): each crash point is reached exactly where its
name says and only when its boundary ended normally; `All` opens observers in order and
tells each one everything."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from opledger.observability import metrics
from opledger.tasks import crashpoints, hooks
from opledger.tasks.hooks import All, CrashPoints, Hooks, Watch

Reached = list[str]


@pytest.fixture
def reached(monkeypatch: pytest.MonkeyPatch) -> Reached:
    names: Reached = []
    monkeypatch.setattr(crashpoints, "reached", names.append)
    return names


class _Claim:
    op_id = "op_01J00000000000000000000000"

    class operation:  # what a Claim's operation carries, for the hooks
        provider = "crm"


CLAIM: Any = _Claim()


def test_a_dispatch_claim_reaches_after_claim_only_when_taken(reached: Reached) -> None:
    points = CrashPoints()
    with points.claim("op_x"):
        pass  # not claimable: nothing
    with points.claim("op_x", retry=True) as watch:
        watch.claim(CLAIM)  # reconcile's retry claim has no crash point
    assert reached == []
    with points.claim("op_x") as watch:
        watch.claim(CLAIM)
    assert reached == ["dispatch.after_claim"]


def test_the_call_reaches_before_only_when_sending_and_after_only_on_a_normal_end(
    reached: Reached,
) -> None:
    points = CrashPoints()
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


def test_after_save_only_for_a_provider_outcome_that_was_saved(reached: Reached) -> None:
    points = CrashPoints()
    with points.record("op_x", 1, "provider", "crm") as watch:
        watch.fenced()
    with points.record("op_x", 1, "evidence", "crm"):
        pass
    assert reached == []
    with points.record("op_x", 1, "provider", "crm"):
        pass
    assert reached == ["dispatch.after_save"]


def test_a_lookup_is_bracketed_by_its_crash_points(reached: Reached) -> None:
    with CrashPoints().lookup(CLAIM.operation) as _:
        assert reached == ["reconcile.before_lookup"]
    assert reached == ["reconcile.before_lookup", "reconcile.after_lookup"]


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


def test_the_default_hooks_put_crash_points_outermost() -> None:
    assert isinstance(hooks.HOOKS, All)
    assert [type(h).__name__ for h in hooks.HOOKS.hooks] == ["CrashPoints", "Tracing", "Metrics"]


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
