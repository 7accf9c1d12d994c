"""The provider's result document: small, canonical, kept with the evidence, never at the
cost of the outcome it came with."""

from __future__ import annotations

from typing import Any

from opledger.console.redaction import Redaction
from opledger.ledger import Confirmed
from opledger.ledger.evidence import RESULT_LIMIT, admit, with_result

from .histories import KEY, attempt, claim, evidence


def test_a_small_result_is_kept_canonical() -> None:
    assert with_result({"status": 200}, {"b": 1, "a": "x"}) == {
        "status": 200,
        "result": {"a": "x", "b": 1},
    }
    assert with_result({"status": 200}) == {"status": 200}  # none given, none kept


def test_a_result_too_large_or_not_json_is_replaced_by_a_note() -> None:
    big = with_result({}, {"blob": "x" * RESULT_LIMIT})
    assert "omitted" in big["result"] and big["result"]["size"] > RESULT_LIMIT
    nan = with_result({}, {"amount": float("nan")})
    assert "cannot be canonicalized" in nan["result"]["omitted"]
    listed: Any = ["not", "an", "object"]
    assert "JSON object" in with_result({"result": listed})["result"]["omitted"]


def test_admit_bounds_a_confirmation_and_keeps_it_confirmed() -> None:
    receipt = Confirmed(receipt_id="pi_1", result={"blob": "x" * (RESULT_LIMIT + 1)})
    admitted = admit(None, claim(), receipt)
    assert isinstance(admitted, Confirmed) and admitted.receipt_id == "pi_1"
    assert admitted.result is not None and "omitted" in admitted.result
    # an adapter that put its document in the detail (the earlier convention) is read too
    legacy = admit(None, claim(), Confirmed(receipt_id="r", detail={"result": {"id": "c1"}}))
    assert isinstance(legacy, Confirmed) and legacy.result == {"id": "c1"}
    assert "result" not in legacy.detail


def test_the_console_hides_result_fields_as_it_hides_payload_fields() -> None:
    rules = Redaction.parse(["pay.*=customer.email"])
    doc = {"id": "pi_1", "customer": {"email": "ann@example.com"}, "token": "tok_live"}
    response = {"kind": "confirmed", "result": doc}
    mismatch = evidence("ambiguous", code="binding_mismatch")
    mismatch = mismatch.model_copy(
        update={"detail": {**mismatch.detail, "receipt": {"result": doc}}}
    )
    attempts, shown = rules.results(
        "pay.charge.v1",
        [attempt().model_copy(update={"response": response})],
        [evidence("confirmed", key=KEY, result=doc), mismatch],
    )
    for doc_shown in (
        attempts[0].response["result"] if attempts[0].response else {},
        shown[0].detail["result"],
        shown[1].detail["receipt"]["result"],
    ):
        assert doc_shown["id"] == "pi_1"
        assert doc_shown["customer"]["email"].startswith("[hidden")
        assert doc_shown["token"].startswith("[hidden")
    # another action's rules do not apply
    _, other = rules.results("crm.close_case.v1", [], [evidence("confirmed", result=doc)])
    assert other[0].detail["result"]["customer"]["email"] == "ann@example.com"
