"""`Ledger.answers`: how operations stand, read in one statement, says exactly what their
whole history says where the answer needs it (the real Postgres), for each state an agent
can be answered in:
prepared, waiting on dependencies (one held by a person), confirmed with a sealed result,
rejected, unknown with and without a review, cancelled."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator

import pytest

from opledger.agents.results import EffectPending, EffectUnknown, result_of
from opledger.ledger import (
    Ambiguous,
    Answer,
    Binding,
    Confirmed,
    Ledger,
    MalformedOperationId,
    OperationNotFound,
    Rejected,
    Status,
)
from tests.intents import prepare

RESULT = {"ticket": "T-9931", "owner": "Quinlan"}


def expected(ledger: Ledger, op_id: str) -> Answer:
    """The answer as the history and the dependencies (several statements) give it."""
    history = ledger.history(op_id)
    op = history.operation
    settled = [e for e in history.evidence if e.applied and e.verdict == op.status.value]
    waiting = op.status is Status.PREPARED
    dispatched = [e for e in history.evidence if e.source.value == "dispatch"]
    unsent = {e.attempt_n for e in dispatched if e.detail.get("code") == "not_sent"}
    never_sent = op.status is Status.UNKNOWN and all(a.n in unsent for a in history.attempts)
    return Answer(
        operation=op,
        last_reason=history.transitions[-1].reason if history.transitions else None,
        settled_detail=settled[-1].detail if settled else {},
        open_review=history.open_review if op.status is Status.UNKNOWN else None,
        blocked_by=tuple(d for d in ledger.dependencies(op_id) if d.blocking and waiting),
        unsent_why=dispatched[-1].detail.get("why") if never_sent and dispatched else None,
    )


@pytest.fixture
def sealing(ledger: Ledger, database_url: str, grant: str) -> Iterator[Ledger]:
    key = f"k1:{base64.b64encode(os.urandom(32)).decode()}"
    sealed = Ledger.from_url(database_url, pool_size=1, payload_keys=key)
    yield sealed
    sealed.engine.dispose()


def test_the_answers_say_what_the_histories_say(sealing: Ledger) -> None:
    ledger = sealing
    ops: dict[str, str] = {}

    ops["prepared"] = prepare(ledger, "prepared")

    ops["confirmed"] = prepare(ledger, "confirmed")
    claim = ledger.claim(ops["confirmed"], owner="w")
    assert claim is not None
    binding = Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target)
    ledger.record_outcome(claim, Confirmed(receipt_id="r1", binding=binding, result=RESULT))
    # later evidence of the same verdict settles nothing: the answer keeps the settling one
    ledger.record_evidence(
        ops["confirmed"],
        source="lookup",
        verdict="confirmed",
        binding=binding,
        detail={"result": {**RESULT, "n": 2}},
    )

    ops["rejected"] = prepare(ledger, "rejected")
    claim = ledger.claim(ops["rejected"], owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Rejected(code="case_not_found", reason="no such case"))

    ops["unknown"] = prepare(ledger, "unknown")
    claim = ledger.claim(ops["unknown"], owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="no answer"))

    ops["held"] = prepare(ledger, "held")
    claim = ledger.claim(ops["held"], owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="no answer"))
    held = ledger.get(ops["held"])
    assert ledger.open_review(held.id, fence=held.fence, reason="no lookup") is not None

    # held by workers without its adapter: nothing sent, twice; and one sent before
    unserved = Ambiguous(code="not_sent", reason="no adapter", detail={"why": "no_adapter"})
    ambiguous = Ambiguous(code="timeout", reason="no answer")
    for name, first in (("unsent", unserved), ("sent then unsent", ambiguous)):
        ops[name] = prepare(ledger, name)
        claim = ledger.claim(ops[name], owner="w")
        assert claim is not None
        ledger.record_outcome(claim, first)
        again = ledger.claim_retry(ops[name], owner="w", expected_fence=claim.fence)
        assert again is not None
        ledger.record_outcome(again, unserved)

    ops["waiting"] = prepare(ledger, "waiting", after=[ops["held"], ops["confirmed"]])
    ops["cancelled"] = prepare(ledger, "cancelled", after=[ops["rejected"]])

    answers = ledger.answers([*ops.values(), "op_00000000000000000000000000"])
    assert set(answers) == set(ops.values())  # an id naming nothing is left out
    for state, op_id in ops.items():
        assert answers[op_id] == expected(ledger, op_id), state
    assert answers[ops["confirmed"]].settled_detail["result"] == RESULT  # opened
    assert answers[ops["rejected"]].settled_detail["code"] == "case_not_found"
    assert answers[ops["held"]].open_review is not None
    assert answers[ops["unknown"]].open_review is None
    [blocked] = answers[ops["waiting"]].blocked_by  # the confirmed dependency blocks nothing
    assert blocked.op_id == ops["held"] and blocked.review_id is not None
    assert answers[ops["cancelled"]].operation.status.value == "cancelled"
    assert answers[ops["unsent"]].unsent_why == "no_adapter"
    assert answers[ops["sent then unsent"]].unsent_why is None  # the first may have applied
    assert answers[ops["unknown"]].unsent_why is None
    assert ledger.answer(ops["prepared"]) == answers[ops["prepared"]]


def test_a_missing_or_malformed_id_is_refused(ledger: Ledger) -> None:
    with pytest.raises(OperationNotFound):
        ledger.answer("op_00000000000000000000000000")
    with pytest.raises(MalformedOperationId):
        ledger.answers(["op_1", "'; DROP TABLE operations; --"])
    assert ledger.answers([]) == {}


def test_the_listeners_reads_are_planned_once(
    ledger: Ledger, database_url: str, grant: str
) -> None:
    """Prepared on a kept connection, the answers' statement runs on its generic plan:
    Postgres would otherwise plan it afresh on each read (a custom plan every time)."""
    op_id = prepare(ledger, "planned")
    own = Ledger.from_url(database_url, pool_size=1)  # its kept connection is this test's
    try:
        for _ in range(12):
            assert set(own.answers([op_id])) == {op_id}
        held = own._store._hot.take()
        rows = held.conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%AS blocked_by%%'"
        ).fetchall()
        own._store._hot.give(held)
    finally:
        own.engine.dispose()
    assert rows == [(12, 0)], rows


def test_an_agent_is_told_nothing_was_sent_when_no_attempt_reached_the_provider(
    ledger: Ledger, grant: str
) -> None:
    """A worker without the action's adapter held it (`no_adapter`), or the provider never
    took the connection: the ledger knows nothing was sent, so the agent is told it waits,
    not that it may have happened. After an attempt that may have applied, it may have."""
    unserved = Ambiguous(code="not_sent", reason="no adapter", detail={"why": "no_adapter"})
    refused = Ambiguous(code="not_sent", reason="refused", detail={"why": "no_connection"})
    told = {}
    for name, outcomes in (
        ("held", [unserved]),
        ("refused", [refused, refused]),
        ("sent, then held", [Ambiguous(code="timeout", reason="no answer"), unserved]),
    ):
        op_id = prepare(ledger, name)
        claim = ledger.claim(op_id, owner="w")
        for n, outcome in enumerate(outcomes):
            assert claim is not None
            if n:
                claim = ledger.claim_retry(op_id, owner="w", expected_fence=claim.fence)
                assert claim is not None
            ledger.record_outcome(claim, outcome)
        told[name] = result_of(ledger.answer(op_id))
    held, down, maybe = told["held"], told["refused"], told["sent, then held"]
    assert isinstance(held, EffectPending) and held.awaiting == "worker"
    assert "is not sent: no worker that took it serves crm.close_case.v1" in held.message
    assert isinstance(down, EffectPending) and down.awaiting == "provider"
    assert "is not sent: crm did not take the connection" in down.message
    assert isinstance(maybe, EffectUnknown) and "it may have" in maybe.message
