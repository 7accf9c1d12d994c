"""An action's declared payload schema is checked by `prepare` on a real Postgres, so every
path that records an act refuses a payload the action does not take — `effect()`, the
ledger's own `prepare`, the LangGraph tools — with one typed error naming the field, and
writes nothing. (The MCP gateway checks its tools' whole arguments first:
tests/integration/test_mcp_gateway.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.agents import EffectPending, Effects
from opledger.agents.answers import refused
from opledger.ledger import InvalidInput, Ledger, PayloadSchemaViolation
from opledger.ledger.payload_schemas import MAX_PROBLEMS, PayloadSchemas, check_schema

REFUND = "stripe.refund.v1"


@pytest.fixture
def registry() -> Registry:
    return Registry(
        [
            StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123"),
            CrmAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )


@pytest.fixture
def checked(ledger: Ledger, registry: Registry) -> Ledger:
    ledger.grant(tenant="acme", scope=["stripe.*", "crm.*"], granted_by="test", ref="auth_a")
    return Ledger(ledger.engine, actions=registry)


@pytest.fixture
def effects(checked: Ledger) -> Effects:
    return Effects(checked, publish=lambda op_id: None, poll=30.0)


def _rows(ledger: Ledger) -> tuple[int, int]:
    with ledger.engine.connect() as conn:
        ops = conn.execute(text("SELECT count(*) FROM operations")).scalar_one()
        asks = conn.execute(text("SELECT count(*) FROM intent_asks")).scalar_one()
    return int(ops), int(asks)


def _refund(effects: Effects, payload: dict[str, Any]) -> Any:
    return effects.effect(
        tenant="acme",
        run="run-1",
        action=REFUND,
        target="ch_1",
        payload=payload,
        authorization_ref="auth_a",
        asked_by="call-1",
    )


@pytest.mark.parametrize(
    ("payload", "field", "said"),
    [
        ({"amount": 500, "note": "sorry"}, "payload", "'note' was unexpected"),
        ({"amount": 500, "reason": "because"}, "payload.reason", "'because' is not one of"),
        ({"amount": "500"}, "payload.amount", "'500' is not of type 'integer'"),
    ],
    ids=["extra field", "wrong enum value", "wrong type"],
)
def test_effect_refuses_a_payload_its_action_does_not_take_and_writes_nothing(
    checked: Ledger, effects: Effects, payload: dict[str, Any], field: str, said: str
) -> None:
    with pytest.raises(PayloadSchemaViolation) as refused_:
        _refund(effects, payload)
    exc = refused_.value
    assert isinstance(exc, InvalidInput)  # every agent surface refuses it as bad input
    assert (exc.field, exc.action) == (field, REFUND)
    assert said in str(exc) and REFUND in str(exc)
    assert _rows(checked) == (0, 0)


def test_a_payload_that_fits_is_recorded(checked: Ledger, effects: Effects) -> None:
    result = _refund(effects, {"amount": 500, "reason": "duplicate"})
    assert isinstance(result, EffectPending)
    assert _rows(checked) == (1, 1)


def test_an_act_already_recorded_is_answered_not_refused_when_asked_again_misfit(
    checked: Ledger, effects: Effects
) -> None:
    """A re-ask whose wording breaks the schema (a model's extra field, a schema tightened
    since) gets the recorded act back with what differs, never "nothing was sent"."""
    first = _refund(effects, {"amount": 500, "reason": "duplicate"})
    again = _refund(effects, {"amount": 500, "reason": "duplicate", "note": "sorry"})
    assert (again.op_id, again.asked_before) == (first.op_id, True)
    assert "payload.note" in again.differs
    assert _rows(checked) == (1, 2)
    with pytest.raises(PayloadSchemaViolation):  # another act with a misfit: refused
        _refund(effects, {"amount": 700, "reason": "duplicate", "note": "sorry"})
    assert _rows(checked) == (1, 2)


def test_the_ledgers_own_prepare_checks_it_too(checked: Ledger) -> None:
    with pytest.raises(PayloadSchemaViolation) as refused_:
        checked.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key="close-318",
            action="crm.close_case.v1",
            target="case-318",
            payload={"note": "done", "priority": "high"},
            authorization_ref="auth_a",
        )
    assert refused_.value.field == "payload"
    assert _rows(checked) == (0, 0)


def test_every_problem_is_named_up_to_a_limit(checked: Ledger, effects: Effects) -> None:
    fields = {f"field_{n}": [n] for n in range(MAX_PROBLEMS + 2)}  # a list is no field value
    with pytest.raises(PayloadSchemaViolation) as refused_:
        effects.effect(
            tenant="acme",
            run="run-1",
            action="crm.update_case.v1",
            target="case-318",
            payload={"fields": fields, "note": 7},
            authorization_ref="auth_a",
        )
    problems = refused_.value.problems
    assert len(problems) == MAX_PROBLEMS
    assert problems[0].startswith("payload.fields.field_0:")
    assert all(p.startswith("payload.") for p in problems)
    assert _rows(checked) == (0, 0)


def test_a_model_reads_the_refusal_with_the_field_named(effects: Effects) -> None:
    with pytest.raises(PayloadSchemaViolation) as refused_:
        _refund(effects, {"amount": 500, "reason": "because"})
    answer = refused(refused_.value)
    assert answer["kind"] == "refused" and answer["error"] == "PayloadSchemaViolation"
    assert "payload.reason" in answer["message"] and "nothing was sent" in answer["message"]


def test_the_langgraph_tool_answers_the_model_instead_of_raising(
    checked: Ledger, effects: Effects
) -> None:
    from pydantic import BaseModel

    from opledger.agents.langgraph import effect_tool

    class Refund(BaseModel):
        charge: str
        amount: int
        reason: str

    tool = effect_tool(
        effects,
        name="refund",
        description="Refund a charge.",
        args_schema=Refund,
        tenant="acme",
        action=REFUND,
        authorization_ref="auth_a",
        effect_of=lambda a: (a["charge"], {"amount": a["amount"], "reason": a["reason"]}),
    )
    call = {"charge": "ch_1", "amount": 500, "reason": "because"}
    message = tool.invoke(
        {"type": "tool_call", "id": "call-1", "name": "refund", "args": call},
        config={"configurable": {"thread_id": "t1"}},
    )
    assert "PayloadSchemaViolation" in str(message.content)
    assert "payload.reason" in str(message.content)
    assert _rows(checked) == (0, 0)


def test_a_resolver_without_schemas_checks_nothing(ledger: Ledger) -> None:
    schemas = PayloadSchemas(None)
    schemas.check(REFUND, lambda: {"anything": object()})  # not even read
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="stripe.refund.v1",
        target="ch_1",
        payload={"whatever": True},
        authorization_ref=ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="test").ref,
    )
    assert op.action == REFUND


def test_an_adapter_with_a_broken_schema_is_refused_when_registered() -> None:
    crm = CrmAdapter("http://127.0.0.1:9", account="acme")
    crm.payload_schemas = {"crm.close_case.v1": {"type": "object", "required": "note"}}
    with pytest.raises(ValueError, match=r"payload schema of crm\.close_case\.v1 is not valid"):
        Registry([crm])
    with pytest.raises(ValueError, match="must be a JSON Schema object"):
        check_schema("x.y.v1", {"type": "array"})
