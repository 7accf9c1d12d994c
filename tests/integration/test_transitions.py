"""Every status pair: the database allows exactly ALLOWED_TRANSITIONS, whoever writes."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError

from opledger.ledger import ALLOWED_TRANSITIONS, Ambiguous, Ledger, Status

PAIRS = [(a, b) for a, b in itertools.product(Status, Status) if a is not b]


def _force(ledger: Ledger, op_id: str, status: Status) -> None:
    """Put a row into `status` without the trigger (test set-up only)."""
    with ledger.engine.begin() as conn:
        conn.execute(text("ALTER TABLE operations DISABLE TRIGGER opledger_guard_operation"))
        conn.execute(
            text(
                "UPDATE operations SET status = CAST(:s AS op_status),"
                " lease_token = CASE WHEN :s = 'dispatching' THEN 'x' END,"
                " lease_expires_at = CASE WHEN :s = 'dispatching' THEN now() END"
                " WHERE id = :id"
            ),
            {"s": status.value, "id": op_id},
        )
        conn.execute(text("ALTER TABLE operations ENABLE TRIGGER opledger_guard_operation"))


@pytest.mark.parametrize(("before", "after"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_the_database_enforces_the_state_machine(
    ledger: Ledger, grant: str, before: Status, after: Status
) -> None:
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-1",
        payload={},
        authorization_ref=grant,
    )
    _force(ledger, op.id, before)
    move = text(
        "UPDATE operations SET status = CAST(:s AS op_status), lease_token = NULL,"
        " lease_expires_at = NULL, fence = fence + 1, changed_by = 'test',"
        " change_reason = 'to ' || :s WHERE id = :id"
    )
    if after is Status.DISPATCHING:
        move = text(
            "UPDATE operations SET status = 'dispatching', lease_token = 't',"
            " lease_expires_at = now(), fence = fence + 1, changed_by = 'test',"
            " change_reason = 'to ' || :s WHERE id = :id"
        )
    allowed = (before, after) in ALLOWED_TRANSITIONS
    if allowed:
        with ledger.engine.begin() as conn:
            conn.execute(move, {"s": after.value, "id": op.id})
        assert ledger.get(op.id).status is after
    else:
        with pytest.raises(DBAPIError) as info, ledger.engine.begin() as conn:
            conn.execute(move, {"s": after.value, "id": op.id})
        assert getattr(info.value.orig, "sqlstate", None) == "OL001"
        assert ledger.get(op.id).status is before


def test_final_statuses_have_no_way_out() -> None:
    for final in (Status.CONFIRMED, Status.REJECTED, Status.CANCELLED):
        assert final.final
        assert not any(a is final for a, _ in ALLOWED_TRANSITIONS)


def test_a_fence_never_goes_back(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-1",
        payload={},
        authorization_ref=grant,
    )
    assert ledger.claim(op.id, owner="w") is not None
    with pytest.raises(DBAPIError) as info, ledger.engine.begin() as conn:
        conn.execute(text("UPDATE operations SET fence = 0 WHERE id = :id"), {"id": op.id})
    assert getattr(info.value.orig, "sqlstate", None) == "OL002"


def test_an_unknown_status_string_is_refused_by_the_enum(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-1",
        payload={},
        authorization_ref=grant,
    )
    with pytest.raises(DBAPIError), ledger.engine.begin() as conn:
        conn.execute(text("UPDATE operations SET status = 'failed' WHERE id = :id"), {"id": op.id})


def test_no_statement_writes_the_audit_trail_by_hand() -> None:
    """The database writes `transitions` (the guard trigger, schema.sql); the ledger's SQL never
    does."""
    from opledger.ledger import queries

    statements = [v.text for v in vars(queries).values() if isinstance(v, TextClause)]
    assert statements and not any("INSERT INTO transitions" in sql for sql in statements)


def test_the_audit_row_records_the_status_the_row_really_had(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-1",
        payload={},
        authorization_ref=grant,
    )
    claim = ledger.claim(op.id, owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="lost"))
    # a change made behind the ledger's back is audited from OLD and NEW all the same
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE operations SET status = 'cancelled', fence = fence + 1,"
                " changed_by = 'dba', change_reason = 'by hand' WHERE id = :id"
            ),
            {"id": op.id},
        )
    trail = [
        (t.from_status, t.to_status, t.fence, t.actor, t.reason)
        for t in ledger.history(op.id).transitions
    ]
    assert trail == [
        (None, Status.PREPARED, 0, "prepare", "prepared"),
        (Status.PREPARED, Status.DISPATCHING, 1, "w", "claim"),
        (Status.DISPATCHING, Status.UNKNOWN, 1, "w", "ambiguous: timeout"),
        (Status.UNKNOWN, Status.CANCELLED, 2, "dba", "by hand"),
    ]


def test_a_status_change_that_does_not_say_who_and_why_is_refused(
    ledger: Ledger, grant: str
) -> None:
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-1",
        payload={},
        authorization_ref=grant,
    )
    with pytest.raises(DBAPIError) as info, ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE operations SET status = 'cancelled', fence = 1 WHERE id = :id"),
            {"id": op.id},
        )
    assert getattr(info.value.orig, "sqlstate", None) == "OL003"
    after = ledger.history(op.id)
    assert after.operation.status is Status.PREPARED and len(after.transitions) == 1
