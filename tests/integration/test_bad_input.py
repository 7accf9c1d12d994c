"""Bad input: a typed error under LedgerError, and the database exactly as it was."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from opledger.ledger import (
    ForgedFence,
    IntentConflict,
    InvalidIdentifier,
    Ledger,
    LedgerError,
    MalformedOperationId,
    OperationNotFound,
    PayloadNotCanonicalizable,
    PayloadTooLarge,
    UnknownAction,
)

GOOD: dict[str, Any] = dict(
    tenant="acme",
    workflow_id="wf",
    intent_key="k",
    action="crm.close_case.v1",
    target="case-1",
    payload={"a": 1},
    authorization_ref="auth_acme",
)


def snapshot(ledger: Ledger) -> dict[str, int]:
    tables = ("operations", "operation_payloads", "attempts", "evidence", "transitions")
    with ledger.engine.connect() as conn:
        return {
            t: int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in tables
        }


PREPARE_CASES: list[tuple[str, dict[str, Any], type[LedgerError]]] = [
    ("nan", {"payload": {"x": math.nan}}, PayloadNotCanonicalizable),
    ("infinity", {"payload": {"x": math.inf}}, PayloadNotCanonicalizable),
    ("non-string key", {"payload": {1: "x"}}, PayloadNotCanonicalizable),
    ("bytes", {"payload": {"x": b"raw"}}, PayloadNotCanonicalizable),
    ("set", {"payload": {"x": {1, 2}}}, PayloadNotCanonicalizable),
    ("huge int", {"payload": {"x": 2**60}}, PayloadNotCanonicalizable),
    ("lone surrogate", {"payload": {"x": "\ud800"}}, PayloadNotCanonicalizable),
    ("not an object", {"payload": ["a", "list"]}, PayloadNotCanonicalizable),
    ("oversized", {"payload": {"x": "y" * (256 * 1024)}}, PayloadTooLarge),
    ("empty tenant", {"tenant": ""}, InvalidIdentifier),
    ("blank intent", {"intent_key": "   "}, InvalidIdentifier),
    ("long target", {"target": "t" * 201}, InvalidIdentifier),
    ("control char", {"workflow_id": "wf\x00"}, InvalidIdentifier),
    ("not text", {"target": 318}, InvalidIdentifier),
    ("unversioned action", {"action": "crm.close_case"}, UnknownAction),
    ("odd action", {"action": "CRM close case v1"}, UnknownAction),
]


@pytest.mark.parametrize(
    ("change", "error"),
    [(c, e) for _, c, e in PREPARE_CASES],
    ids=[name for name, _, _ in PREPARE_CASES],
)
def test_prepare_refuses_bad_input_and_writes_nothing(
    ledger: Ledger, grant: str, change: dict[str, Any], error: type[LedgerError]
) -> None:
    before = snapshot(ledger)
    with pytest.raises(error) as info:
        ledger.prepare(**{**GOOD, **change})
    assert isinstance(info.value, LedgerError)
    assert str(info.value)
    assert snapshot(ledger) == before


def test_a_payload_just_under_the_limit_is_accepted(ledger: Ledger, grant: str) -> None:
    overhead = len('{"x":""}')
    op = ledger.prepare(**{**GOOD, "payload": {"x": "y" * (256 * 1024 - overhead)}})
    assert op.payload_size == 256 * 1024


def test_a_changed_payload_under_an_old_intent_changes_nothing(ledger: Ledger, grant: str) -> None:
    ledger.prepare(**GOOD)
    before = snapshot(ledger)
    with pytest.raises(IntentConflict):
        ledger.prepare(**{**GOOD, "payload": {"a": 2}})
    assert snapshot(ledger) == before


MALFORMED_IDS = [
    "",
    "op_",
    "op_123",
    "OP_01ARZ3NDEKTSV4RRFFQ69G5FAV",
    "op_01ARZ3NDEKTSV4RRFFQ69G5FAVX",
    "op_01ARZ3NDEKTSV4RRFFQ69G5FAU",
    "'; DROP TABLE operations; --",
    None,
    42,
]


@pytest.mark.parametrize("bad", MALFORMED_IDS)
@pytest.mark.parametrize(
    "call",
    [
        lambda ledger, op_id: ledger.get(op_id),
        lambda ledger, op_id: ledger.history(op_id),
        lambda ledger, op_id: ledger.claim(op_id, owner="w"),
        lambda ledger, op_id: ledger.cancel(op_id, reason="r"),
    ],
    ids=["get", "history", "claim", "cancel"],
)
def test_malformed_operation_ids_are_refused(
    ledger: Ledger, bad: object, call: Callable[[Ledger, object], object]
) -> None:
    with pytest.raises(MalformedOperationId):
        call(ledger, bad)


def test_a_well_formed_id_that_does_not_exist(ledger: Ledger) -> None:
    missing = "op_01ARZ3NDEKTSV4RRFFQ69G5FAV"
    with pytest.raises(OperationNotFound):
        ledger.get(missing)
    with pytest.raises(OperationNotFound):
        ledger.claim(missing, owner="w")


def test_a_claim_for_another_operation_is_forged(ledger: Ledger, grant: str) -> None:
    from opledger.ledger import Ambiguous

    a = ledger.prepare(**GOOD)
    b = ledger.prepare(**{**GOOD, "intent_key": "k2"})
    claim_a = ledger.claim(a.id, owner="w")
    claim_b = ledger.claim(b.id, owner="w")
    assert claim_a is not None and claim_b is not None
    before = snapshot(ledger)
    crossed = claim_a.model_copy(update={"op_id": b.id})
    with pytest.raises(ForgedFence):
        ledger.record_outcome(crossed, Ambiguous(code="x", reason="y"))
    assert snapshot(ledger) == before
