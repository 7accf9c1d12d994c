"""A provider's pressure, held by the ledger for the whole fleet: its declared concurrency
and rate, its "not now" answers and its breaker, enforced by the claim statement before
anything is taken, and read back by `Ledger.providers`.

Against the real Postgres: the slots, the rate bucket and the breaker are rows, and the
functions that move them (`opledger_admit`, `opledger_press`) run in the claim and outcome
statements themselves.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from opledger.ledger import (
    Ambiguous,
    Binding,
    Claim,
    ClaimTerms,
    Confirmed,
    Ledger,
    LedgerError,
    ProviderBusy,
    Status,
)
from opledger.ledger.contract import Limits
from opledger.ledger.evidence import NO_CONNECTION, NOT_SENT, THROTTLED
from tests.intents import prepare

S = timedelta(seconds=1)


def terms(**limits: float | int) -> ClaimTerms:
    """Claim terms for the test actions' provider ("crm") under `limits`."""
    form = Limits.model_validate(limits).claim_form() if limits else {}
    return ClaimTerms(lease=30 * S, limits_by_provider={"crm": form} if form else {})


def confirmed(claim: Claim) -> Confirmed:
    return Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))


def refused() -> Ambiguous:
    return Ambiguous(code=NOT_SENT, reason="no connection", detail={"why": NO_CONNECTION})


def take(ledger: Ledger, op_id: str, t: ClaimTerms) -> Claim:
    claim = ledger.claim(op_id, owner="w", terms=t)
    assert claim is not None
    return claim


def test_a_full_set_of_slots_refuses_before_anything_is_taken(ledger: Ledger, grant: str) -> None:
    t = terms(concurrency=2)
    first, second, third = (prepare(ledger, k) for k in ("a", "b", "c"))
    a, b = take(ledger, first, t), take(ledger, second, t)
    with pytest.raises(ProviderBusy) as busy:
        ledger.claim(third, owner="w", terms=t)
    assert busy.value.provider == "crm" and "2 calls in flight" in busy.value.why
    # room comes for sure when the first slot's call can no longer be running: its
    # in-flight deadline (a call answering sooner wakes a waiting operation instead)
    frees_at = min(a.deadline_at, b.deadline_at)
    assert a.db_now is not None
    assert abs((a.db_now + busy.value.retry_in) - frees_at) < S
    # the waiting operation took nothing: still prepared, fence 0, no attempt
    history = ledger.history(third)
    assert history.operation.status is Status.PREPARED and history.operation.fence == 0
    assert not history.attempts
    assert [p.in_flight for p in ledger.providers() if p.provider == "crm"] == [2]
    # an answer gives the slot back: the third goes
    ledger.record_outcome(a, confirmed(a))
    take(ledger, third, t)
    with pytest.raises(ProviderBusy):
        ledger.claim(prepare(ledger, "d"), owner="w", terms=t)
    assert b.fence == 1


def test_a_lost_answer_keeps_its_slot_until_the_call_can_no_longer_run(
    ledger: Ledger, grant: str
) -> None:
    t = ClaimTerms(
        lease=30 * S,
        send_window=S,
        in_flight=S,
        limits_by_provider={"crm": Limits(concurrency=1).claim_form()},
    )
    claim = take(ledger, prepare(ledger, "a"), t)
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="read timed out"))
    waiting = prepare(ledger, "b")
    with pytest.raises(ProviderBusy):  # the timed-out call may still be running there
        ledger.claim(waiting, owner="w", terms=t)
    deadline = claim.deadline_at
    time.sleep(max((deadline - datetime.now(UTC)).total_seconds(), 0) + 0.1)
    take(ledger, waiting, t)  # past its in-flight deadline (send window + in-flight time)


def test_the_rate_lets_a_burst_through_then_one_call_a_step(ledger: Ledger, grant: str) -> None:
    t = terms(rate=10, burst=2)
    ops = [prepare(ledger, f"r{i}") for i in range(3)]
    take(ledger, ops[0], t)
    take(ledger, ops[1], t)
    with pytest.raises(ProviderBusy) as busy:
        ledger.claim(ops[2], owner="w", terms=t)
    assert "10 calls a second" in busy.value.why
    assert timedelta(0) < busy.value.retry_in <= timedelta(seconds=0.1)
    time.sleep(busy.value.retry_in.total_seconds() + 0.01)
    take(ledger, ops[2], t)


def test_claims_racing_for_a_limited_provider_never_exceed_its_slots(
    ledger: Ledger, grant: str
) -> None:
    t = terms(concurrency=3)
    ops = [prepare(ledger, f"x{i}") for i in range(24)]

    def attempt(op_id: str) -> bool:
        try:
            return ledger.claim(op_id, owner="w", terms=t) is not None
        except ProviderBusy:
            return False

    with ThreadPoolExecutor(8) as pool:
        taken = list(pool.map(attempt, ops))
    assert sum(taken) == 3


def test_refused_connections_open_the_breaker_and_one_probe_closes_it(
    ledger: Ledger, grant: str
) -> None:
    limits = Limits(breaker_after=3, probe_every=timedelta(seconds=0.5))
    t = terms()
    for key in ("a", "b", "c"):
        claim = take(ledger, prepare(ledger, key), t)
        ledger.record_outcome(claim, refused(), limits=limits)
    waiting = [prepare(ledger, k) for k in ("d", "e")]
    with pytest.raises(ProviderBusy) as busy:
        ledger.claim(waiting[0], owner="w", terms=t)
    assert "refusing connections" in busy.value.why
    (state,) = ledger.providers()
    assert state.breaker == "open" and state.paused and state.failures == 3
    assert state.paused_since is not None
    time.sleep(0.6)  # the first probe is due: one call goes, the next waits for it
    probe = take(ledger, waiting[0], t)
    with pytest.raises(ProviderBusy) as second:
        ledger.claim(waiting[1], owner="w", terms=t)
    assert second.value.why is not None
    # the probe is refused too: the wait doubles
    ledger.record_outcome(probe, refused(), limits=limits)
    (state,) = ledger.providers()
    assert state.breaker == "open"
    assert state.paused_until is not None
    assert state.paused_until - state.read_at > timedelta(seconds=0.8)
    time.sleep((state.paused_until - state.read_at).total_seconds() + 0.1)
    probe = take(ledger, waiting[1], t)
    ledger.record_outcome(probe, confirmed(probe), limits=limits)  # it answered: closed
    (state,) = ledger.providers()
    assert state.breaker == "closed" and not state.paused and state.failures == 0
    take(ledger, prepare(ledger, "f"), t)


def test_late_refusals_of_calls_claimed_before_the_breaker_opened_move_no_probe(
    ledger: Ledger, grant: str
) -> None:
    """Calls already in flight when the breaker opens come back refused one by one: each
    counts as a refusal, but neither delays the first probe nor lets a second one start."""
    limits = Limits(breaker_after=3, probe_every=timedelta(seconds=0.5))
    t = terms()
    in_flight = [take(ledger, prepare(ledger, f"early-{n}"), t) for n in range(8)]
    for claim in in_flight[:3]:
        ledger.record_outcome(claim, refused(), limits=limits)  # the breaker opens
    time.sleep(0.6)
    probe = take(ledger, prepare(ledger, "probe"), t)  # the first probe, on time
    for claim in in_flight[3:]:  # refused late, while the probe is in flight
        ledger.record_outcome(claim, refused(), limits=limits)
    (state,) = ledger.providers()
    assert state.breaker == "open" and state.failures == 8
    with pytest.raises(ProviderBusy):  # the probe's hold stands: no second probe
        ledger.claim(prepare(ledger, "second"), owner="w", terms=t)
    ledger.record_outcome(probe, refused(), limits=limits)  # the probe itself: the wait doubles
    (state,) = ledger.providers()
    assert state.paused_until is not None  # the first doubling: 1 s, not 2**6 probes' worth
    wait = state.paused_until - state.read_at
    assert timedelta(seconds=0.8) < wait <= timedelta(seconds=1), wait


def test_a_probe_answered_not_now_pauses_only_for_the_wait_asked(
    ledger: Ledger, grant: str
) -> None:
    limits = Limits(breaker_after=1, probe_every=timedelta(seconds=0.2))
    t = terms()
    ledger.record_outcome(take(ledger, prepare(ledger, "a"), t), refused(), limits=limits)
    time.sleep(0.3)
    probe = take(ledger, prepare(ledger, "probe"), t)  # held for its send window and more
    throttled = Ambiguous(code=THROTTLED, reason="HTTP 429", detail={"retry_after_s": 0.5})
    ledger.record_outcome(probe, throttled, limits=limits)
    (state,) = ledger.providers()
    assert state.breaker == "closed" and state.paused_until is not None
    assert state.paused_until - state.read_at <= timedelta(seconds=0.5)
    time.sleep(0.6)
    take(ledger, prepare(ledger, "after"), t)


def test_a_refusal_reported_twice_counts_once(ledger: Ledger, grant: str) -> None:
    limits = Limits(breaker_after=2)
    claim = take(ledger, prepare(ledger, "twice"), terms())
    ledger.record_outcome(claim, refused(), limits=limits)
    with contextlib.suppress(LedgerError):  # the same report again (a retried commit)
        ledger.record_outcome(claim, refused(), limits=limits)
    (state,) = ledger.providers()
    assert state.failures == 1 and state.breaker == "closed"


def test_an_answer_between_refusals_starts_the_count_again(ledger: Ledger, grant: str) -> None:
    limits = Limits(breaker_after=2)
    t = terms()
    outcomes = [refused(), None, refused()]
    for n, outcome in enumerate(outcomes):
        claim = take(ledger, prepare(ledger, f"k{n}"), t)
        ledger.record_outcome(claim, outcome or confirmed(claim), limits=limits)
    (state,) = ledger.providers()
    assert state.breaker == "closed" and state.failures == 1


def test_not_now_pauses_the_provider_for_the_wait_it_asked(ledger: Ledger, grant: str) -> None:
    t = terms()
    claim = take(ledger, prepare(ledger, "a"), t)
    throttled = Ambiguous(
        code=THROTTLED, reason="HTTP 429", detail={"status": 429, "retry_after_s": 0.7}
    )
    ledger.record_outcome(claim, throttled, limits=Limits())
    waiting = prepare(ledger, "b")
    with pytest.raises(ProviderBusy) as busy:
        ledger.claim(waiting, owner="w", terms=t)
    assert "asked to wait 0.7 s (HTTP 429)" in busy.value.why
    assert timedelta(seconds=0.3) < busy.value.retry_in <= timedelta(seconds=0.7)
    time.sleep(busy.value.retry_in.total_seconds() + 0.05)
    take(ledger, waiting, t)
    # a huge Retry-After is taken only up to the contract's cap
    claim = take(ledger, prepare(ledger, "c"), t)
    huge = Ambiguous(code=THROTTLED, reason="HTTP 429", detail={"retry_after_s": 86400})
    ledger.record_outcome(claim, huge, limits=Limits(retry_after_max=timedelta(seconds=2)))
    (state,) = ledger.providers()
    assert state.paused_until is not None
    assert state.paused_until - state.read_at <= timedelta(seconds=2)


def test_a_deferred_operation_is_relayed_when_its_wait_ends_not_before(
    ledger: Ledger, grant: str
) -> None:
    op_id = prepare(ledger, "a")
    now = datetime.now(UTC)
    assert ledger.defer(op_id, until=now + timedelta(seconds=0.5))
    published: list[str] = []
    ledger.relay(older_than=timedelta(hours=1), publish=lambda i, _g: published.append(i))
    assert published == []  # waiting for its provider
    assert [p.waiting for p in ledger.providers()] == [1]
    time.sleep(0.6)
    ledger.relay(older_than=timedelta(hours=1), publish=lambda i, _g: published.append(i))
    assert published == [op_id]  # due now, however recently it was created
    assert ledger.get(op_id).next_check_at is None
    assert not ledger.defer(take(ledger, op_id, terms()).op_id, until=now)  # claimed: not prepared


def test_waiting_for_a_provider_does_not_slow_the_relay_of_a_lost_message(
    ledger: Ledger, grant: str
) -> None:
    op_id = prepare(ledger, "deferred")
    generations: list[int] = []
    for _ in range(5):  # deferred for its provider five times, each publish due
        assert ledger.defer(op_id, until=datetime.now(UTC) - timedelta(seconds=1))
        ledger.relay(older_than=timedelta(hours=1), publish=lambda _i, g: generations.append(g))
    assert generations == [1, 2, 3, 4, 5]
    # its last message is lost: published again after the relay's wait, not 2**4 times it
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE operations SET created_at = now() - interval '2 minutes',"
                " enqueued_at = now() - interval '0.3 seconds' WHERE id = :id"
            ),
            {"id": op_id},
        )
    ledger.relay(older_than=timedelta(seconds=0.2), publish=lambda _i, g: generations.append(g))
    assert generations[5:] == [6]
