"""The ledger is a checkpoint too: keys derived from the intent, a switch noticed and
recorded once, every open operation quarantined with its fence raised, a suspect first
claim quarantined instead of sent, and a provider's answer to a forgotten claim kept.

A real failover and a real restore are in tests/system/test_failover.py. Here the server
is made to look switched: epoch 0's recorded timeline is moved away from the server's (what
a promotion looks like to the ledger), or a process is told it saw more of the ledger than
the ledger now holds (what a restore looks like). Each test works on ledgers of its own
(their own `Store`, so their own view of the database), never the session's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from opledger.adapters.crm import crm_contract
from opledger.ledger import (
    Ambiguous,
    Binding,
    ClaimForgotten,
    Confirmed,
    EvidenceSource,
    ForgedFence,
    Ledger,
    OperationNotFound,
    Quarantined,
    StaleFence,
    Status,
    Verdict,
    canonicalize,
)
from opledger.ledger.decide import Confirm, NeedsReview, decide
from opledger.ledger.epochs import lsn_text
from opledger.ledger.evidence import LEDGER_SWITCH
from opledger.ledger.ids import LONGEST_KEY, intent_idempotency_key
from tests.intents import intent, prepare_op

NewLedger = Callable[[], Ledger]


@pytest.fixture
def new_ledger(ledger: Ledger, grant: str) -> Iterator[NewLedger]:
    """Ledgers of the test's own on the session's engine: each sees the database afresh."""

    def make() -> Ledger:
        return Ledger(ledger.engine)

    yield make


def look_switched(ledger: Ledger) -> None:
    """Make the server look promoted: the ledger's newest epoch says another timeline."""
    with ledger.engine.begin() as conn:
        conn.execute(text("UPDATE ledger_epochs SET timeline = timeline + 1000"))


def receipt(key: str, target: str) -> Confirmed:
    """A receipt that binds the usual intent's operation: its key, target and payload."""
    digest = canonicalize({"note": "resolved"}).digest
    return Confirmed(
        receipt_id="rcpt-9",
        binding=Binding(idempotency_key=key, target=target, payload_digest=digest),
    )


# -- keys ------------------------------------------------------------------------------------


def test_the_key_is_derived_from_the_intent_and_survives_a_lost_record(
    new_ledger: NewLedger,
) -> None:
    first, other = new_ledger(), new_ledger()
    op = prepare_op(first, "k1")
    assert op.idempotency_key.startswith("opk_") and len(op.idempotency_key) <= LONGEST_KEY
    assert op.idempotency_key != op.id
    # a digest and nothing else: nothing of the intent can be read back from it
    assert re.fullmatch(r"opk_[0-9A-HJKMNP-TV-Z]{26}", op.idempotency_key)
    expected = intent_idempotency_key(
        first._store.key_namespace(),
        tenant="acme",
        workflow_id="wf",
        action="crm.close_case.v1",
        intent_key="k1",
    )
    assert op.idempotency_key == expected
    # the record is lost (a failover, a restore): the act asked again gets the same key
    with first.engine.begin() as conn:
        conn.execute(text("DELETE FROM operations WHERE id = :id"), {"id": op.id})
    again = prepare_op(other, "k1")
    assert again.id != op.id and again.idempotency_key == op.idempotency_key
    # every part of the intent makes another key, and so does another ledger's namespace
    namespace = first._store.key_namespace()
    usual = {"tenant": "acme", "workflow_id": "wf", "action": "crm.close_case.v1"}
    others = {
        intent_idempotency_key(namespace, **(usual | {"tenant": "acme-2"}), intent_key="k1"),
        intent_idempotency_key(namespace, **(usual | {"workflow_id": "wf-2"}), intent_key="k1"),
        intent_idempotency_key(namespace, **(usual | {"action": "crm.reopen.v1"}), intent_key="k1"),
        intent_idempotency_key(namespace, **usual, intent_key="k2"),
        intent_idempotency_key("another ledger", **usual, intent_key="k1"),
    }
    assert len(others) == 5 and op.idempotency_key not in others
    assert prepare_op(first, "k2").idempotency_key in others


# -- a switch, noticed and recorded once -----------------------------------------------------


def test_a_promotion_is_recorded_once_and_every_open_operation_is_quarantined(
    new_ledger: NewLedger,
) -> None:
    worker, other = new_ledger(), new_ledger()
    waiting = prepare_op(worker, "waiting")
    flying = prepare_op(worker, "flying")
    claim = worker.claim(flying.id, owner="w1")
    assert claim is not None and claim.epoch == 0
    lost = prepare_op(worker, "lost")
    lost_claim = worker.claim(lost.id, owner="w1")
    assert lost_claim is not None
    worker.record_outcome(lost_claim, Ambiguous(code="timeout", reason="no answer"))
    done = prepare_op(worker, "done")
    done_claim = worker.claim(done.id, owner="w1")
    assert done_claim is not None
    worker.record_outcome(done_claim, receipt(done_claim.idempotency_key, done.target))
    late = prepare_op(worker, "late")

    look_switched(worker)
    before = datetime.now(UTC)
    # the next claim notices: nothing is claimed on a ledger that went back; the switch is
    # recorded first, and the operation it asked for is quarantined with the others
    assert worker.claim(late.id, owner="w1") is None
    epochs = other.epochs()
    assert [e.epoch for e in epochs] == [1, 0]
    switch = epochs[0]
    assert switch.kind == "timeline" and switch.detected_by == "w1"
    assert switch.timeline is not None and switch.previous_timeline == switch.timeline + 1000
    assert switch.quarantined == 4  # waiting, flying, lost and late; never the confirmed one
    assert switch.fence_floor >= int(before.timestamp() * 1_000_000)
    assert switch.suspect_until is not None and switch.suspect_until > before
    # another process notices the same switch: it adopts it, nothing is recorded twice
    assert other.check_switch(by="w2") == switch
    assert worker.check_switch(by="w1") == switch
    assert len(other.epochs()) == 2

    for op in (waiting, flying, lost, late):
        history = other.history(op.id)
        now = history.operation
        assert now.status is Status.UNKNOWN and now.lease_owner is None
        assert now.fence >= switch.fence_floor  # no fence is ever issued twice
        forgotten = history.attempts[-1]
        assert forgotten.fence == now.fence and forgotten.idempotency_key == op.idempotency_key
        assert forgotten.outcome == "ambiguous"
        assert forgotten.deadline_at > switch.began_at  # it may still be in flight
        (noted,) = [ev for ev in history.evidence if ev.detail.get("code") == LEDGER_SWITCH]
        assert noted.detail["switch"] == 1 and noted.attempt_n == forgotten.n
        assert "ledger switch #1" in history.transitions[-1].reason
    assert other.get(done.id).status is Status.CONFIRMED
    # the worker whose claim was taken back in flight is fenced out; its answer is kept
    with pytest.raises(StaleFence):
        worker.record_outcome(claim, receipt(claim.idempotency_key, flying.target))
    kept = [ev for ev in other.history(flying.id).evidence if ev.verdict == "confirmed"]
    assert len(kept) == 1 and not kept[0].applied
    # a retry claims above every fence issued before the switch
    retried = worker.claim_retry(waiting.id, owner="w1", expected_fence=other.get(waiting.id).fence)
    assert retried is not None and retried.fence == switch.fence_floor + 1
    assert retried.epoch == 1


def test_an_operation_prepared_after_the_switch_is_quarantined_not_sent(
    new_ledger: NewLedger,
) -> None:
    worker = new_ledger()
    look_switched(worker)
    worker.check_switch(by="w1")
    fresh = prepare_op(worker, "asked-again")
    with pytest.raises(Quarantined):
        worker.claim(fresh.id, owner="w1")
    history = worker.history(fresh.id)
    assert history.operation.status is Status.UNKNOWN
    assert [a.outcome for a in history.attempts] == ["ambiguous"]
    # once an operator ends the window, what is prepared from then on is sent as usual
    ended = worker.end_suspicion(1, by="alice")
    assert ended.ended_by == "alice"
    new = prepare_op(worker, "new-act")
    claim = worker.claim(new.id, owner="w1")
    assert claim is not None and claim.fence == 1


def test_a_person_is_told_of_the_switch_when_no_evidence_can_decide(
    new_ledger: NewLedger,
) -> None:
    worker = new_ledger()
    op = prepare_op(worker, "no-dedup")
    look_switched(worker)
    worker.check_switch(by="w1")
    history = worker.history(op.id)
    contract = crm_contract(keys=False, lookup="none")
    later = datetime.now(UTC) + timedelta(hours=1)
    decision = decide(contract, history.operation, history.attempts, history.evidence, None, later)
    assert isinstance(decision, NeedsReview)
    assert decision.reason.startswith("ledger switch #1")


def test_a_restore_is_noticed_by_a_process_that_saw_more(new_ledger: NewLedger) -> None:
    worker, fresh = new_ledger(), new_ledger()
    op = prepare_op(worker, "r")
    assert worker.claim(op.id, owner="w1") is not None
    witness = worker._store.witness
    assert witness.epoch == 0 and witness.flushed > 0
    # as if the database were restored from a backup taken before what this process saw
    witness.flushed += 1 << 40
    seen = lsn_text(witness.flushed)
    other = prepare_op(fresh, "r2")
    assert worker.claim(other.id, owner="w1") is None  # quarantined by the switch
    (switch, _) = fresh.epochs()
    assert switch.kind == "rewind" and switch.seen_lsn == seen
    assert "back at" in switch.reason
    assert fresh.get(op.id).status is Status.UNKNOWN
    # a process that had seen a newer epoch than the ledger holds notices too
    newer = new_ledger()
    assert newer.check_switch() is not None
    newer._store.witness.epoch = 9
    assert newer.check_switch(by="w3") is not None
    kinds = [e.kind for e in fresh.epochs()]
    assert kinds == ["rewind", "rewind", "initial"]


# -- providers' answers to forgotten claims ---------------------------------------------------


def test_an_answer_for_a_forgotten_operation_is_kept_and_found_when_the_act_is_asked_again(
    new_ledger: NewLedger,
) -> None:
    worker, agent = new_ledger(), new_ledger()
    op = prepare_op(worker, "gone")
    claim = worker.claim(op.id, owner="w1")
    assert claim is not None
    # the switch took back the whole operation (its prepare had not reached the standby)
    with worker.engine.begin() as conn:
        conn.execute(text("DELETE FROM operations WHERE id = :id"), {"id": op.id})
    look_switched(worker)
    with pytest.raises(ClaimForgotten) as caught:
        worker.record_outcome(claim, receipt(claim.idempotency_key, op.target))
    assert caught.value.fields["evidence_kept"] is False
    (orphan,) = agent.orphan_receipts(unmatched=True)
    assert orphan.forgotten and orphan.why == "operation missing" and orphan.claim_epoch == 0
    assert orphan.ledger_epoch == 1 and orphan.verdict == "confirmed"
    assert orphan.idempotency_key == op.idempotency_key
    # the agent asks for the act again, long after the suspicion window: never sent blind
    agent.end_suspicion(1, by="alice")
    again = agent.prepare(**intent("gone"))
    assert again.idempotency_key == op.idempotency_key
    with pytest.raises(Quarantined):
        agent.claim(again.id, owner="w2")
    history = agent.history(again.id)
    assert agent.orphan_receipts(unmatched=True) == ()
    contract = crm_contract()
    decision = decide(
        contract,
        history.operation,
        history.attempts,
        history.evidence,
        None,
        datetime.now(UTC),
    )
    assert isinstance(decision, Confirm)
    (found,) = [ev for ev in history.evidence if ev.id == decision.evidence_id]
    assert found.detail["orphan_receipt"] == orphan.id


def test_a_forged_claim_in_the_same_epoch_is_refused_and_its_answer_kept_aside(
    new_ledger: NewLedger,
) -> None:
    worker = new_ledger()
    op = prepare_op(worker, "forged")
    claim = worker.claim(op.id, owner="w1")
    assert claim is not None
    forged = claim.model_copy(update={"token": "f" * 32})
    with pytest.raises(ForgedFence):
        worker.record_outcome(forged, receipt(claim.idempotency_key, op.target))
    (orphan,) = worker.orphan_receipts()
    assert not orphan.forgotten and orphan.matched_op_id is None
    assert worker.history(op.id).evidence == ()  # never evidence of anything
    missing = claim.model_copy(
        update={"operation": claim.operation.model_copy(update={"id": "op_" + "0" * 26})}
    )
    with pytest.raises(OperationNotFound):
        worker.record_outcome(missing, receipt(claim.idempotency_key, op.target))
    assert len(worker.orphan_receipts()) == 2
    assert worker.orphan_receipts(unmatched=True)[0].why == "operation missing"


def test_the_replication_the_ledger_runs_on_is_read(new_ledger: NewLedger) -> None:
    replication = new_ledger().replication()
    assert replication.synchronous_commit in ("on", "off", "local", "remote_write", "remote_apply")
    assert not replication.in_recovery
    # the test server streams to no standby: a failover is a restore there
    assert replication.kind == "none" and not replication.durable_on_failover
    assert "no standby" in replication.summary()


def test_the_switches_command_lists_epochs_orphans_and_ends_a_window(
    new_ledger: NewLedger, invoke: Callable[..., Any]
) -> None:
    worker = new_ledger()
    op = prepare_op(worker, "cli")
    claim = worker.claim(op.id, owner="w1")
    assert claim is not None
    with worker.engine.begin() as conn:
        conn.execute(text("DELETE FROM operations WHERE id = :id"), {"id": op.id})
    look_switched(worker)
    with pytest.raises(ClaimForgotten):
        worker.record_outcome(claim, receipt(claim.idempotency_key, op.target))
    listed = invoke("switches", "--json")
    assert listed.code == 0, listed.err
    document = listed.json()
    assert [e["epoch"] for e in document["epochs"]] == [1, 0]
    assert document["replication"]["kind"] == "none"
    table = invoke("switches")
    assert "timeline" in table.out and "no standby" in table.out
    orphans = invoke("switches", "orphans", "--unmatched", "--json").json()
    assert [o["op_id"] for o in orphans] == [op.id]
    ended = invoke("switches", "end", "1", "--operator", "alice")
    assert ended.code == 0 and "ended by alice" in ended.out
    assert worker.epochs()[0].ended_by is not None
    refused = invoke("switches", "end", "7", "--operator", "alice")
    assert refused.code == 3 and "no switch #7" in refused.err


def test_a_fleet_whose_claims_wait_for_a_synchronous_standby_quarantines_nothing_on_a_promotion(
    new_ledger: NewLedger,
) -> None:
    worker = new_ledger()
    worker.claims_synchronous = True  # OPLEDGER_REQUIRE_SYNC_STANDBY on every process
    op = prepare_op(worker, "kept")
    look_switched(worker)
    switch = worker.check_switch(by="w1")
    assert switch is not None and switch.kind == "timeline" and switch.quarantined == 0
    assert switch.suspect_until is None and "OPLEDGER_REQUIRE_SYNC_STANDBY" in switch.reason
    claim = worker.claim(op.id, owner="w1")  # sent as usual: nothing was lost
    assert claim is not None and claim.fence == 1 and claim.epoch == 1
    # a restore still quarantines: nothing replicates into a backup
    worker._store.witness.flushed += 1 << 40
    rewind = worker.check_switch(by="w1")
    assert rewind is not None and rewind.kind == "rewind" and rewind.quarantined == 1


def test_strict_mode_claims_nothing_without_a_synchronous_standby(
    new_ledger: NewLedger, database_url: str
) -> None:
    from opledger.adapters.registry import load_registry
    from opledger.settings import Settings
    from opledger.tasks import app as tasks

    settings = Settings.from_environ(
        {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_REQUIRE_SYNC_STANDBY": "true"}
    )
    ledger = new_ledger()
    rt = tasks.Runtime(
        settings=settings, ledger=ledger, registry=load_registry(settings), owner="w1"
    )
    tasks._replication_read = (-tasks.REPLICATION_TTL_S, None)
    why = tasks.unreplicated(rt)
    assert why is not None and "no standby" in why
    relaxed = tasks.Runtime(
        settings=Settings.from_environ({"OPLEDGER_DATABASE_URL": database_url}),
        ledger=ledger,
        registry=rt.registry,
        owner="w1",
    )
    assert tasks.unreplicated(relaxed) is None


def test_an_operation_waiting_on_another_is_quarantined_only_once_it_may_run(
    new_ledger: NewLedger,
) -> None:
    worker = new_ledger()
    first = prepare_op(worker, "first")
    then = prepare_op(worker, "then", after=[first.id])
    look_switched(worker)
    worker.check_switch(by="w1")
    assert worker.get(first.id).status is Status.UNKNOWN
    # still waiting: neither claimed nor quarantined, so its dependency can release it
    assert worker.claim(then.id, owner="w1") is None
    assert worker.get(then.id).status is Status.PREPARED
    found = worker.record_evidence(
        first.id,
        source=EvidenceSource.LOOKUP,
        verdict=Verdict.CONFIRMED,
        binding=receipt(first.idempotency_key, first.target).binding,
    )
    worker.settle(
        first.id,
        fence=worker.get(first.id).fence,
        to=Status.CONFIRMED,
        evidence_id=found.id,
        actor="w1",
        reason="found by its key",
    )
    assert worker.get(then.id).waiting_on == 0
    with pytest.raises(Quarantined):  # free to run now, and prepared before the switch
        worker.claim(then.id, owner="w1")
    assert worker.claim(then.id, owner="w2") is None  # asked again: quarantined once only
    history = worker.history(then.id)
    assert [a.outcome for a in history.attempts] == ["ambiguous"]
