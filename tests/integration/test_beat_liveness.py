"""Beat liveness against a real Postgres: the beat's heartbeat written and read, and each
reader of it — `opledger check`, the workers' watch, the gauges, the agent's answer and
`opledger ops show` — saying when no beat runs. (The whole of it with real workers and a
real beat: tests/system/test_beat_liveness.py.)"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from opledger.agents import EffectPending, Effects
from opledger.ledger import DatabaseUnavailable, Ledger
from opledger.ledger.beats import BeatSeen
from opledger.observability.ledger_gauges import LedgerCollector
from opledger.tasks.beat import Heartbeat
from opledger.tasks.beatwatch import BeatWatch
from tests.clirun import Run
from tests.intents import prepare

MINUTE = timedelta(seconds=60)


def beat(ledger: Ledger, *, host: str = "beat-host", pid: int = 4242) -> None:
    """What a running beat's scheduler writes on a tick."""
    ledger.beat_heartbeat(host=host, pid=pid, started_at=datetime.now(UTC) - timedelta(hours=1))


def ago(said: str, seconds: int) -> bool:
    """Whether `said` says "(N s ago)" with N from `seconds` to a few more (the test's own
    time between setting the age and reading it)."""
    found = re.search(r"\((\d+) s ago\)", said)
    return found is not None and seconds <= int(found.group(1)) <= seconds + 5


def age_heartbeat(ledger: Ledger, seconds: float) -> None:
    """The beat last ticked `seconds` ago (it stopped then)."""
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_heartbeat SET seen_at = now() - make_interval(secs => :s)"),
            {"s": seconds},
        )


def test_the_heartbeat_says_who_ticked_when_and_none_before_any_beat(ledger: Ledger) -> None:
    never = ledger.beat_seen()
    assert not never.ever and never.age is None and never.missing(MINUTE)
    assert never.since() == "none has ever run against this ledger"
    beat(ledger, host="h1", pid=1)
    seen = ledger.beat_seen()
    assert (seen.host, seen.pid) == ("h1", 1) and seen.ever
    assert seen.age is not None and seen.age < timedelta(seconds=5)
    assert not seen.missing(MINUTE) and "running since" in seen.who()
    # another beat (a restart, another host) takes the one row over
    beat(ledger, host="h2", pid=2)
    assert (ledger.beat_seen().host, ledger.beat_seen().pid) == ("h2", 2)
    with ledger.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM beat_heartbeat")).scalar() == 1
    age_heartbeat(ledger, 90)
    stale = ledger.beat_seen()
    assert stale.missing(MINUTE) and not stale.missing(timedelta(seconds=120))
    assert stale.since().startswith("not seen since ") and ago(stale.since(), 90)


def test_the_beats_heartbeat_is_written_at_most_every_few_seconds_and_a_failure_once(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    heartbeat = Heartbeat(ledger, every=5.0, clock=lambda: now[0])
    assert heartbeat.beat() and ledger.beat_seen().pid is not None
    first = ledger.beat_seen().seen_at
    now[0] += 4.9
    assert not heartbeat.beat() and ledger.beat_seen().seen_at == first  # throttled
    now[0] += 0.1
    assert heartbeat.beat() and ledger.beat_seen().seen_at != first

    class Away:
        def beat_heartbeat(self, **_: object) -> None:
            raise DatabaseUnavailable("the ledger's database is unavailable: gone")

    failing = Heartbeat(Away(), every=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="opledger.beat"):
        for _ in range(3):
            assert not failing.beat()
            now[0] += 1
        failing._ledger = ledger
        assert failing.beat() and failing.beat() is False  # written, then throttled
    said = [r.getMessage() for r in caplog.records]
    assert len([s for s in said if "cannot write its heartbeat" in s]) == 1, said
    assert len([s for s in said if "written into the ledger again" in s]) == 1, said


def test_a_worker_says_once_that_beat_is_missing_and_once_that_it_is_back(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    watch = BeatWatch(ledger.beat_seen, missing_after=MINUTE, logger=logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"):
        assert watch.check() is True and watch.check() is True
        beat(ledger)
        assert watch.check() is False and watch.check() is False
        age_heartbeat(ledger, 75)
        assert watch.check() is True and watch.check() is True
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in said] == ["WARNING", "INFO", "WARNING"], said
    assert said[0][1].startswith("no beat has ever run against this ledger: nothing relays")
    assert "`opledger beat`" in said[0][1]
    assert said[1][1].startswith("beat is back: it ticked 0 s ago (host beat-host, pid 4242")
    assert said[2][1].startswith("no beat: beat not seen since ") and ago(said[2][1], 75)


def test_a_watch_that_cannot_read_says_so_once_and_keeps_what_it_knew(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def away() -> BeatSeen:
        raise DatabaseUnavailable("the ledger's database is unavailable: gone")

    watch = BeatWatch(away, missing_after=MINUTE, logger=logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"):
        assert watch.check() is None and watch.check() is None
    assert len(caplog.records) == 1 and "cannot be read" in caplog.records[0].getMessage()


def test_check_fails_without_a_beat_and_says_how_to_start_one(
    ledger: Ledger, invoke: Callable[..., Run]
) -> None:
    never = invoke("check", "--no-broker")
    assert never.code == 4, never.out
    assert (
        "FAIL beat: no beat has ever run against this ledger; without beat nothing relays"
        in never.out
    ), never.out
    assert "start one with `opledger beat`" in never.out
    beat(ledger)
    ok = invoke("check", "--no-broker")
    assert ok.code == 0, ok.out
    assert "ok   beat: ticked 0 s ago (host beat-host, pid 4242, running since" in ok.out
    age_heartbeat(ledger, 45)
    assert invoke("check", "--no-broker").code == 0  # within the default minute
    stale = invoke("check", "--no-broker", "--json", OPLEDGER_BEAT_MISSING_AFTER_SECONDS="30")
    assert stale.code == 4
    (said,) = [c for c in stale.json() if c["name"] == "beat"]
    assert not said["ok"] and not said["warning"]
    assert said["detail"].startswith(
        "no beat seen for 30 s (OPLEDGER_BEAT_MISSING_AFTER_SECONDS): beat not seen since "
    )
    assert ago(said["detail"], 45) and "s ago), last host beat-host, pid 4242" in said["detail"]


def test_the_startup_checks_of_worker_and_beat_do_not_ask_for_a_beat(
    ledger: Ledger, database_url: str
) -> None:
    from opledger.cli.checks import run_checks

    env = {"OPLEDGER_DATABASE_URL": database_url}
    assert "beat" in [c.name for c in run_checks(env, broker=False)]
    assert "beat" not in [c.name for c in run_checks(env, broker=False, beat=False)]


def _gauges(ledger: Ledger) -> dict[str, float]:
    return {
        family.name: family.samples[0].value
        for family in LedgerCollector(ledger.engine).collect()
        if family.name.startswith("opledger_beat_last_seen")
    }


def test_the_gauges_say_since_when_and_that_none_ever_ran(ledger: Ledger) -> None:
    assert _gauges(ledger) == {
        "opledger_beat_last_seen_timestamp_seconds": 0.0,
        "opledger_beat_last_seen_age_seconds": float("inf"),
    }
    beat(ledger)
    fresh = _gauges(ledger)
    assert 0 <= fresh["opledger_beat_last_seen_age_seconds"] < 5
    seen_at = ledger.beat_seen().seen_at
    assert seen_at is not None
    assert fresh["opledger_beat_last_seen_timestamp_seconds"] == pytest.approx(seen_at.timestamp())
    age_heartbeat(ledger, 120)
    assert _gauges(ledger)["opledger_beat_last_seen_age_seconds"] >= 120


def test_an_agent_waiting_on_the_relay_is_told_that_no_beat_runs(
    ledger: Ledger, grant: str
) -> None:
    def lost(op_id: str) -> None:
        raise ConnectionError("the broker is down")

    effects = Effects(ledger, publish=lost)
    asked = effects.effect(
        tenant="acme",
        run="wf",
        action="crm.close_case.v1",
        target="case-1",
        payload={"note": "resolved"},
        authorization_ref=grant,
        intent_key="close",
        wait=0,
    )
    assert isinstance(asked, EffectPending) and asked.awaiting == "worker"
    assert asked.waiting_for == (
        "a worker to take it; it waits for beat, none has ever run against this ledger: "
        "beat's relay publishes what no worker got, and none runs"
    )
    assert "it waits for beat, none has ever run" in asked.message
    beat(ledger)
    now = effects.result(asked.op_id)
    assert isinstance(now, EffectPending) and now.waiting_for == "a worker to take it"
    age_heartbeat(ledger, 75)
    stale = effects.result(asked.op_id)
    assert isinstance(stale, EffectPending)
    assert "; it waits for beat, not seen since " in stale.waiting_for
    assert ago(stale.waiting_for, 75)
    # one waiting on its dependency waits on that, not on the relay: nothing said of beat
    after = effects.effect(
        tenant="acme",
        run="wf",
        action="crm.close_case.v1",
        target="case-2",
        payload={"note": "resolved"},
        authorization_ref=grant,
        intent_key="after",
        after=[asked],
    )
    assert isinstance(after, EffectPending) and after.awaiting == "dependencies"
    assert "beat" not in after.waiting_for


def test_ops_show_says_a_prepared_operation_waits_for_a_missing_beat(
    ledger: Ledger, grant: str, invoke: Callable[..., Run]
) -> None:
    op_id = prepare(ledger, "waits")
    shown = invoke("ops", "show", op_id, "--json").json()
    assert shown["waits_for_beat"].startswith(
        "waits for beat, none has ever run against this ledger: beat's relay publishes"
    )
    table = invoke("ops", "show", op_id)
    assert f"{op_id} waits for beat, none has ever run" in " ".join(table.out.split())
    beat(ledger)
    assert invoke("ops", "show", op_id, "--json").json()["waits_for_beat"] is None
    age_heartbeat(ledger, 90)
    later = invoke("ops", "show", op_id, "--json").json()["waits_for_beat"]
    assert later.startswith("waits for beat, not seen since ") and ago(later, 90)
