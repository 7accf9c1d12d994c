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
    PayloadTooDeep,
    PayloadTooLarge,
    UnknownAction,
)
from opledger.ledger.canonical import DEFAULT_MAX_PAYLOAD_BYTES, MAX_DEPTH, MAX_ITEMS
from opledger.settings import Settings, SettingsInvalid

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


def nested(depth: int) -> dict[str, Any]:
    """An object nesting `depth` objects (the top one included), built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def cyclic() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


PREPARE_CASES: list[tuple[str, dict[str, Any], type[LedgerError]]] = [
    ("990 deep", {"payload": nested(990)}, PayloadTooDeep),
    ("one too deep", {"payload": nested(MAX_DEPTH + 1)}, PayloadTooDeep),
    ("deep in a list", {"payload": {"x": [[[[[nested(MAX_DEPTH)]]]]]}}, PayloadTooDeep),
    ("cyclic", {"payload": cyclic()}, PayloadTooDeep),
    ("wide array", {"payload": {"x": [0] * (MAX_ITEMS + 1)}}, PayloadTooLarge),
    ("huge string", {"payload": {"x": "y" * (10 * 1024 * 1024)}}, PayloadTooLarge),
    ("huge key", {"payload": {"y" * (300 * 1024): 1}}, PayloadTooLarge),
    ("zero-width intent", {"intent_key": "close\u200b"}, InvalidIdentifier),
    ("bidi target", {"target": "case-\u202e813"}, InvalidIdentifier),
    ("word joiner tenant", {"tenant": "ac\u2060me"}, InvalidIdentifier),
    ("grapheme joiner intent", {"intent_key": "ca\u034fse-7"}, InvalidIdentifier),
    ("variation selector target", {"target": "case-7\ufe0f"}, InvalidIdentifier),
    ("mongolian selector workflow", {"workflow_id": "wf\u180b"}, InvalidIdentifier),
    ("leading mark target", {"target": "\u0301case-7"}, InvalidIdentifier),
    ("private-use intent", {"intent_key": "k\ue000"}, InvalidIdentifier),
    ("unassigned target", {"target": "case-\u0378"}, InvalidIdentifier),
    ("trailing space target", {"target": "case-7 "}, InvalidIdentifier),
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


def test_a_payload_at_the_depth_limit_is_accepted_and_claimable(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**{**GOOD, "payload": nested(MAX_DEPTH)})
    claim = ledger.claim(op.id, owner="w")
    assert claim is not None and claim.payload == nested(MAX_DEPTH)


def test_acceptance_does_not_depend_on_the_callers_stack_depth(ledger: Ledger, grant: str) -> None:
    import sys

    results: list[Any] = []

    def deep(n: int) -> None:
        if n > 0:
            deep(n - 1)
            return
        for key, payload in (("deep-ok", nested(MAX_DEPTH)), ("deep-bad", nested(990))):
            try:
                results.append(ledger.prepare(**{**GOOD, "intent_key": key, "payload": payload}))
            except LedgerError as exc:
                results.append(exc)

    # call from close to the recursion limit: only a few dozen frames are left
    deep(sys.getrecursionlimit() - 120)
    ok, bad = results
    assert not isinstance(ok, Exception), ok
    assert isinstance(bad, PayloadTooDeep)


def test_nfc_and_nfd_spellings_of_an_intent_are_one_operation(ledger: Ledger, grant: str) -> None:
    nfc = ledger.prepare(**{**GOOD, "intent_key": "caf\u00e9", "target": "Zo\u00eb"})
    nfd = ledger.prepare(**{**GOOD, "intent_key": "cafe\u0301", "target": "Zoe\u0308"})
    assert nfd.id == nfc.id
    assert nfc.intent_key == "caf\u00e9" and nfc.target == "Zo\u00eb"  # stored in NFC
    other_tenant = ledger.grant(
        tenant="Mu\u0308nchen", scope=["crm.*"], granted_by="test", ref="auth_muc"
    )
    assert other_tenant.tenant == "M\u00fcnchen"
    op = ledger.prepare(**{**GOOD, "tenant": "M\u00fcnchen", "authorization_ref": "auth_muc"})
    assert ledger.list(tenant="Mu\u0308nchen") == (op,)


def test_an_nfd_spelling_longer_than_the_limit_names_the_same_operation(
    ledger: Ledger, grant: str
) -> None:
    """The limit counts the stored (NFC) form: 150 "é" are 300 code points in NFD."""
    nfc = ledger.prepare(**{**GOOD, "intent_key": "\u00e9" * 150})
    nfd = ledger.prepare(**{**GOOD, "intent_key": "e\u0301" * 150})
    assert nfd.id == nfc.id and nfc.intent_key == "\u00e9" * 150


def test_from_url_takes_the_payload_limit_its_settings_give(
    database_url: str, grant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit comes from the settings (`ledger_options`); the ledger reads no variable
    of its own for it."""
    monkeypatch.setenv("OPLEDGER_MAX_PAYLOAD_BYTES", "100")
    options = Settings.from_environ({"OPLEDGER_MAX_PAYLOAD_BYTES": "100"}).ledger_options()
    limited = Ledger.from_url(database_url, pool_size=1, **options)
    plain = Ledger.from_url(database_url, pool_size=1)
    try:
        assert limited.max_payload_bytes == 100
        with pytest.raises(PayloadTooLarge):
            limited.prepare(**{**GOOD, "payload": {"x": "y" * 200}})
        assert plain.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES  # the variable unread
    finally:
        limited.engine.dispose()
        plain.engine.dispose()
    with pytest.raises(SettingsInvalid, match="OPLEDGER_MAX_PAYLOAD_BYTES"):
        Settings.from_environ({"OPLEDGER_MAX_PAYLOAD_BYTES": "lots"})


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
    crossed = claim_a.model_copy(update={"operation": claim_b.operation})
    with pytest.raises(ForgedFence):
        ledger.record_outcome(crossed, Ambiguous(code="x", reason="y"))
    assert snapshot(ledger) == before
