"""Nothing silently stops the fleet: a missing beat is seen, said and survived.

Real workers and no beat — as the issue saw it, beat never started against this ledger —
with an operation whose publish failed: `opledger check` fails naming beat, the gauge and
the alert's condition say so, the agent's answer names the missing beat. Starting beat
clears each of them, and the operation confirms (its relay publishes it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from opledger.agents import EffectConfirmed, EffectPending, Effects
from opledger.dev.processes import Stack, wait_until
from opledger.ledger import Ledger
from opledger.observability.ledger_gauges import LedgerCollector
from tests.consoles import Job, opledger_forked

from .conftest import settled, worker_with

pytestmark = pytest.mark.system

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
AGE = "opledger_beat_last_seen_age_seconds"


def beat_alert_fires(ledger: Ledger) -> bool:
    """The `OpledgerBeatMissing` alert's condition on the gauge as it reads now (its
    expression, `agg(gauge) > threshold`, evaluated on the one series there is)."""
    rules = yaml.safe_load(ALERTS.read_text())
    (expr,) = [
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r["alert"] == ("OpledgerBeatMissing")
    ]
    found = re.fullmatch(rf"(?:min|max)\({AGE}\) > (\d+)", expr.strip())
    assert found is not None, expr
    return gauge(ledger) > float(found.group(1))


def gauge(ledger: Ledger) -> float:
    (value,) = [
        f.samples[0].value for f in LedgerCollector(ledger.engine).collect() if f.name == AGE
    ]
    return float(value)


def check(stack: Stack) -> tuple[int, str]:
    (done,) = opledger_forked(Job(["check"], stack.env))
    return done.returncode, done.stdout + done.stderr


def lost(op_id: str) -> None:
    raise ConnectionError("the broker did not take it")


def test_without_beat_check_the_alert_and_the_agent_say_so_and_starting_one_clears_them(
    running: Stack, sys_ledger: Ledger
) -> None:
    assert running.beat is not None and running.workers
    running.beat.kill()  # workers up, no beat: none ever ran against this ledger
    running.beat = None
    with sys_ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM beat_heartbeat"))
    # the worker `w1`, which counts a beat missing after 10 s (it reads every 5 s)
    with worker_with(running, OPLEDGER_BEAT_MISSING_AFTER_SECONDS="10") as worker:
        wait_until(lambda: "no beat has ever run" in worker.output(), 10, "the worker's word")
        effects = Effects(sys_ledger, publish=lost)
        asked = effects.effect(
            tenant="acme",
            run="onboarding-7",
            action="crm.close_case.v1",
            target="case-7",
            payload={"note": "resolved"},
            authorization_ref="auth_acme",
            wait=0,
        )
        # the agent: it waits for a worker, and for the beat whose relay would publish it
        assert isinstance(asked, EffectPending) and asked.operation.status == "prepared"
        assert "it waits for beat, none has ever run against this ledger" in asked.message

        code, said = check(running)
        assert code == 4, said
        assert "FAIL beat: no beat has ever run against this ledger" in said, said
        assert "start one with `opledger beat`" in said
        assert gauge(sys_ledger) == float("inf") and beat_alert_fires(sys_ledger)

        running.start_beat(wait=True)
        wait_until(lambda: not sys_ledger.beat_seen().missing(), 15, "the beat's first tick")
        code, said = check(running)
        assert code == 0, said
        assert "ok   beat: ticked" in said, said
        assert gauge(sys_ledger) < 15 and not beat_alert_fires(sys_ledger)
        # the relay publishes what no worker got: it confirms, and the answer says so
        assert settled(sys_ledger, [asked.op_id]) == {asked.op_id: "confirmed"}
        assert isinstance(effects.result(asked.op_id), EffectConfirmed)
        logged = wait_until(
            lambda: "beat is back" in worker.output() and worker.output(), 10, "beat back"
        )
    # the worker said each once, not on every read
    assert logged.count("no beat has ever run against this ledger") == 1, logged
    assert logged.count("beat is back: it ticked") == 1, logged
