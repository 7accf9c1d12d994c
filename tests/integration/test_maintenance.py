"""What beat and reconcile write: lease expiry, due checks, relay, purge, resolve, reviews."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from opledger.ledger import (
    Ambiguous,
    Binding,
    Confirmed,
    ForbiddenTransition,
    Ledger,
    StaleFence,
    Status,
)
from tests.intents import age, key_of, prepare


def _unknown(ledger: Ledger, key: str) -> str:
    op_id = prepare(ledger, key)
    claim = ledger.claim(op_id, owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="lost"))
    return op_id


def test_expired_leases_are_fenced_out_once_even_by_overlapping_sweeps(
    ledger: Ledger, grant: str
) -> None:
    stale = [prepare(ledger, f"s{i}") for i in range(30)]
    for op_id in stale:
        assert ledger.claim(op_id, owner="dead", lease=timedelta(milliseconds=100)) is not None
    live = prepare(ledger, "live")
    assert ledger.claim(live, owner="alive", lease=timedelta(minutes=5)) is not None
    time.sleep(0.2)
    with ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(lambda _: ledger.expire_leases(limit=10), range(8)))
    swept = [op for batch in batches for op in batch]
    assert sorted(swept) == sorted(stale)
    for op_id in stale:
        history = ledger.history(op_id)
        assert history.operation.status is Status.UNKNOWN
        assert history.operation.fence == 2
        assert history.transitions[-1].reason == "lease expired"
    assert ledger.get(live).status is Status.DISPATCHING


def test_due_checks_are_handed_out_once_per_backoff(ledger: Ledger, grant: str) -> None:
    op_id = _unknown(ledger, "u")  # due immediately after an ambiguous outcome
    later = _unknown(ledger, "later")
    ledger.schedule_check(later, fence=1, at=datetime.now(UTC) + timedelta(hours=1))
    assert ledger.due_checks(backoff=timedelta(seconds=1)) == [op_id]
    assert ledger.due_checks(backoff=timedelta(seconds=1)) == []
    time.sleep(1.1)
    assert ledger.due_checks(backoff=timedelta(seconds=1)) == [op_id]


def test_relay_publishes_unclaimed_prepared_operations_then_marks_them(
    ledger: Ledger, grant: str
) -> None:
    old = prepare(ledger, "old")
    age(ledger, old, 120)
    fresh = prepare(ledger, "fresh")
    claimed = prepare(ledger, "claimed")
    age(ledger, claimed, 120)
    ledger.claim(claimed, owner="w")
    published: list[str] = []
    assert ledger.relay(
        older_than=timedelta(seconds=60), publish=lambda op_id, _gen: published.append(op_id)
    ) == [old]
    assert published == [old]
    assert (
        ledger.relay(
            older_than=timedelta(seconds=60), publish=lambda op_id, _gen: published.append(op_id)
        )
        == []
    )
    assert fresh not in published


def test_a_crash_between_publish_and_mark_publishes_again(ledger: Ledger, grant: str) -> None:
    old = prepare(ledger, "old")
    age(ledger, old, 120)
    published: list[str] = []

    def crash() -> None:
        raise RuntimeError("crashed before marking")

    with pytest.raises(RuntimeError):
        ledger.relay(
            older_than=timedelta(seconds=60),
            publish=lambda op_id, _gen: published.append(op_id),
            before_mark=crash,
        )
    assert ledger.relay(
        older_than=timedelta(seconds=60), publish=lambda op_id, _gen: published.append(op_id)
    ) == [old]
    assert published == [old, old]


def test_purge_deletes_old_finished_payloads_and_keeps_digests(ledger: Ledger, grant: str) -> None:
    done = prepare(ledger, "done")
    claim = ledger.claim(done, owner="w")
    assert claim is not None
    ledger.record_outcome(
        claim, Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))
    )
    age(ledger, done, 3600, column="updated_at")
    waiting = prepare(ledger, "waiting", payload={"k": "waiting"})
    age(ledger, waiting, 3600, column="updated_at")
    assert ledger.purge_payloads(older_than=timedelta(minutes=30)) == 1
    assert ledger.payload(done) is None
    assert ledger.get(done).payload_digest == claim.operation.payload_digest
    assert ledger.history(done).evidence  # the facts stay
    assert ledger.payload(waiting) == {"k": "waiting"}


def test_resolve_is_conditional_on_the_fence_it_decided_on(ledger: Ledger, grant: str) -> None:
    op_id = _unknown(ledger, "u")
    ev = ledger.record_evidence(
        op_id,
        source="lookup",
        verdict="confirmed",
        binding=Binding(idempotency_key=key_of(ledger, op_id), receipt_id="r9"),
    )
    assert not ev.applied
    retry = ledger.claim_retry(op_id, owner="other", expected_fence=1)
    assert retry is not None  # somebody moved it since fence 1
    with pytest.raises(StaleFence):
        ledger.settle(op_id, fence=1, to=Status.CONFIRMED, evidence_id=ev.id, actor="r", reason="x")
    ledger.record_outcome(retry, Ambiguous(code="timeout", reason="again"))
    settled = ledger.settle(
        op_id,
        fence=2,
        to=Status.CONFIRMED,
        evidence_id=ev.id,
        receipt_id="r9",
        actor="r",
        reason="x",
    )
    assert settled.status is Status.CONFIRMED and settled.provider_result_id == "r9"
    assert any(e.id == ev.id and e.applied for e in ledger.history(op_id).evidence)
    # on its current fence, a settled operation is refused by the statement's status guard
    refusal = ledger.record_evidence(op_id, source="lookup", verdict="rejected")
    record = ledger.history(op_id)
    assert record.operation.fence == 3  # the fence the caller holds is the current one
    with pytest.raises(StaleFence):
        ledger.settle(
            op_id, fence=3, to=Status.REJECTED, evidence_id=refusal.id, actor="r", reason="x"
        )
    assert ledger.history(op_id) == record
    # resolve settles as confirmed or rejected only: anything else is refused before the
    # database is asked
    with pytest.raises(ForbiddenTransition, match="confirmed or rejected"):
        ledger.settle(op_id, fence=3, to=Status.CANCELLED, evidence_id=ev.id, actor="r", reason="x")
    assert ledger.history(op_id) == record


def test_a_retry_claim_with_a_stale_expected_fence_gets_nothing(ledger: Ledger, grant: str) -> None:
    op_id = _unknown(ledger, "u")
    assert ledger.claim_retry(op_id, owner="w2", expected_fence=0) is None
    assert ledger.get(op_id).fence == 1


def test_one_open_review_per_operation_and_no_more_checks(ledger: Ledger, grant: str) -> None:
    op_id = _unknown(ledger, "u")
    review = ledger.open_review(op_id, fence=1, reason="nothing decisive", snapshot={"a": 1})
    assert review is not None and review.snapshot == {"a": 1}
    assert ledger.open_review(op_id, fence=1, reason="again") is None
    assert ledger.get(op_id).next_check_at is None
    assert ledger.due_checks(backoff=timedelta(seconds=1)) == []
    with pytest.raises(StaleFence):
        ledger.open_review(op_id, fence=0, reason="from an old view")


# -- the backlog guard (relay and check hand-outs publish only into the queue's headroom) --


def _relay(ledger: Ledger, depth: int | None, after: float = 0.3) -> list[tuple[str, int]]:
    published: list[tuple[str, int]] = []
    ledger.relay(
        older_than=timedelta(seconds=after),
        publish=lambda op_id, gen: published.append((op_id, gen)),
        depth=depth,
        interval=timedelta(seconds=0.1),
    )
    return published


def test_the_relay_holds_while_the_queue_is_deep_and_resumes_once_it_drained(
    ledger: Ledger, grant: str
) -> None:
    waiting = [prepare(ledger, f"w{i}") for i in range(5)]
    for op_id in waiting:
        age(ledger, op_id, 120)
    # Their messages are queued behind 10,000 others: late, not lost.
    assert _relay(ledger, depth=10_000) == []
    assert _relay(ledger, depth=9_990) == []
    guard = ledger.queue_guard("dispatch")
    assert guard is not None and guard.shallow_since is None
    # The queue drained (a broker wipe looks the same): after it stayed shallow for the
    # relay's wait, each one is published once, as generation 1.
    assert _relay(ledger, depth=0) == []
    time.sleep(0.35)
    assert sorted(_relay(ledger, depth=0)) == sorted((op_id, 1) for op_id in waiting)
    assert _relay(ledger, depth=0) == []  # not again before its doubled wait


def test_each_republication_doubles_the_wait(ledger: Ledger, grant: str) -> None:
    op_id = prepare(ledger, "lost-again")
    age(ledger, op_id, 120)
    published: list[int] = []
    for _ in range(3):
        age(ledger, op_id, 0.65, column="enqueued_at")
        ledger.relay(
            older_than=timedelta(seconds=0.2), publish=lambda _op, gen: published.append(gen)
        )
    # waits of 0.2, 0.4 and 0.8 s: the third run comes too early for generation 3
    assert published == [1, 2]
    with ledger.engine.connect() as conn:
        assert (
            conn.execute(
                text("SELECT relay_gen FROM operations WHERE id = :id"), {"id": op_id}
            ).scalar_one()
            == 2
        )


def test_checks_are_handed_out_only_into_the_headroom_and_numbered(
    ledger: Ledger, grant: str
) -> None:
    ops = [_unknown(ledger, f"u{i}") for i in range(6)]
    for op_id in ops:
        age(ledger, op_id, 5, column="next_check_at")
    backoff = timedelta(seconds=30)
    every = timedelta(seconds=0.5)
    # A reconcile queue 500 deep that drained 100 since the last sample: hold.
    ledger.hand_out_checks(backoff=backoff, depth=600, interval=every)
    time.sleep(0.3)  # rates are measured over at least half an interval
    assert ledger.hand_out_checks(backoff=backoff, depth=500, interval=every) == []
    # Empty: a first batch goes out, each check numbered 1.
    out = ledger.hand_out_checks(backoff=backoff, depth=0, interval=every, limit=40)
    assert sorted(out) == sorted((op_id, 1) for op_id in ops)
    assert ledger.hand_out_checks(backoff=backoff, depth=0, interval=every) == []
