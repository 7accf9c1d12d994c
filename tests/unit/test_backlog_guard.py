"""The backlog guard's budget (pure): nothing is published into a queue deeper than the
workers drain in one interval, and recovery resumes once it is shallow again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from opledger.ledger.backlog import GuardState, plan

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HALF = timedelta(seconds=0.5)


def _at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def test_a_deep_queue_holds_everything() -> None:
    # 100 messages drained per second: 50 per interval; 5,000 queued.
    state = GuardState(sampled_at=_at(0), depth_after=5_100, drain_per_s=0.0)
    p = plan(state, depth=5_000, now=_at(1), interval=HALF, limit=500)
    assert p.state.drain_per_s == 100.0
    assert p.allowed == 0 and not p.shallow
    assert p.state.shallow_since is None


def test_a_wiped_queue_is_no_sign_of_draining_where_claims_are_counted() -> None:
    state = GuardState(sampled_at=_at(0), depth_after=1_800, counter=500, drain_per_s=0.0)
    p = plan(state, depth=0, counter=506, now=_at(1), interval=HALF, limit=500)
    assert p.state.drain_per_s == 6.0


def test_the_claim_counter_measures_drain_when_others_refill_the_queue() -> None:
    # Agents publish as fast as workers drain: the depth stays at 30, yet 200 claims/s.
    state = GuardState(sampled_at=_at(0), depth_after=30, counter=1_000)
    p = plan(state, depth=30, counter=1_200, now=_at(1), interval=HALF, limit=500)
    assert p.state.drain_per_s == 200.0
    assert p.shallow and p.allowed == 170  # two intervals' drain, 30 already queued


def test_the_relay_waits_until_the_queue_was_shallow_for_its_hold() -> None:
    state = GuardState(sampled_at=_at(0), depth_after=100, drain_per_s=0.0)
    first = plan(
        state, depth=10, now=_at(1), interval=HALF, limit=500, hold_for=timedelta(seconds=2)
    )
    assert first.shallow and first.allowed == 0
    assert first.state.shallow_since == _at(1)
    later = plan(
        first.state,
        depth=0,
        now=_at(1) + timedelta(seconds=2),
        interval=HALF,
        limit=500,
        hold_for=timedelta(seconds=2),
    )
    assert later.allowed > 0
    assert later.state.shallow_since == _at(1)


def test_an_idle_queue_gets_a_floor_and_the_budget_doubles_while_drained() -> None:
    p = plan(GuardState(), depth=0, now=_at(0), interval=HALF, limit=500)
    assert p.allowed == 5  # a hundredth of the batch: no drain measured yet
    # the 5 were claimed within the interval: twice as many may go next
    q = plan(
        GuardState(sampled_at=_at(0), depth_after=5, counter=0),
        depth=0,
        counter=5,
        now=_at(0.5),
        interval=HALF,
        limit=500,
    )
    assert q.state.drain_per_s == 10.0 and q.allowed == 10


def test_what_the_guard_itself_queued_is_no_backlog() -> None:
    # 100 claims/s: the relay may keep up to 100 queued; 80 are: still shallow since T0.
    state = GuardState(sampled_at=_at(0), counter=0, depth_after=100, shallow_since=_at(-5))
    p = plan(state, depth=80, counter=100, now=_at(1), interval=HALF, limit=500)
    assert p.shallow and p.state.shallow_since == _at(-5) and p.allowed == 20


def test_a_quiet_queue_forgets_its_drain_slowly() -> None:
    state = GuardState(sampled_at=_at(0), depth_after=0, drain_per_s=100.0)
    p = plan(state, depth=0, now=_at(60), interval=HALF, limit=500)
    assert 49 < p.state.drain_per_s < 51


def test_an_unreadable_queue_disables_the_guard_but_not_the_backoff() -> None:
    p = plan(GuardState(drain_per_s=5.0), depth=None, now=_at(0), interval=HALF, limit=500)
    assert p.allowed == 500


def test_two_runs_close_together_keep_the_reference_sample() -> None:
    state = GuardState(sampled_at=_at(0), depth_after=100, counter=10, drain_per_s=4.0)
    p = plan(state, depth=100, counter=10, now=_at(0.05), interval=HALF, limit=500)
    assert p.state.sampled_at == _at(0) and p.state.counter == 10
    assert p.state.drain_per_s == 4.0  # no rate from 50 ms of noise
