"""Intents on a real Postgres: `Ledger.ask` answers an intent asked again (and keeps every
ask as evidence), the adapters' declared intent fields decide what is another act, and a
grant is needed in force only for a new act."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry
from opledger.agents import EffectPending, Effects
from opledger.ledger import (
    Asked,
    AuthorizationRevoked,
    InvalidInput,
    Ledger,
    OutOfScope,
    UnknownAuthorization,
)


def _ask(ledger: Ledger, **kw: Any) -> Asked:
    args: dict[str, Any] = {
        "tenant": "acme",
        "workflow_id": "run-1",
        "intent_key": "close",
        "action": "crm.close_case.v1",
        "target": "case-1",
        "payload": {"note": "first"},
        "authorization_ref": "auth_acme",
    }
    args.update(kw)
    return ledger.ask(**args)


def test_an_intent_asked_again_is_answered_and_every_ask_is_kept(
    ledger: Ledger, grant: str
) -> None:
    first = _ask(ledger, asked_by="call_a")
    assert first.first and first.differs == ()
    op = first.operation
    same = _ask(ledger, asked_by="call_b")
    assert same.operation.id == op.id and not same.first and same.differs == ()
    ledger.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_other")
    changed = _ask(ledger, payload={"note": "reworded"}, authorization_ref="auth_other")
    assert changed.operation == ledger.get(op.id)
    assert changed.differs == ("payload_digest", "authorization_ref")
    asks = ledger.asks(op.id)
    assert [(a.asked_by, a.authorization_ref, a.differs) for a in asks] == [
        ("call_a", "auth_acme", ()),
        ("call_b", "auth_acme", ()),
        (None, "auth_other", ("payload_digest", "authorization_ref")),
    ]
    assert asks[0].payload_digest == op.payload_digest != asks[2].payload_digest
    assert ledger.payload(op.id) == {"note": "first"}  # nothing of the re-ask was recorded
    # a plain prepare records no ask
    prepared = ledger.prepare(
        tenant="acme",
        workflow_id="run-1",
        intent_key="other",
        action="crm.close_case.v1",
        target="case-2",
        payload={},
        authorization_ref="auth_acme",
    )
    assert ledger.asks(prepared.id) == ()
    # whatever a transport puts in its ids is kept as text, never refused
    odd = _ask(ledger, asked_by="call\x00\n", payload={"note": "x"})
    numeric = _ask(ledger, asked_by=17)
    assert odd.operation.id == numeric.operation.id == op.id
    assert [a.asked_by for a in ledger.asks(op.id)][-2:] == ["call??", "17"]


def test_a_recorded_act_is_answered_under_a_revoked_grant_a_new_one_is_not(
    ledger: Ledger, grant: str
) -> None:
    op = _ask(ledger).operation
    ledger.revoke(grant, by="t", reason="rotated")
    again = _ask(ledger, asked_by="call_c")
    assert again.operation.id == op.id and again.differs == ()
    with pytest.raises(AuthorizationRevoked):  # a new act needs a grant in force
        _ask(ledger, intent_key="another", target="case-2")
    # a grant out of scope, or another tenant's, reads nothing
    ledger.grant(tenant="acme", scope=["email.*"], granted_by="t", ref="auth_mail")
    with pytest.raises(OutOfScope):
        _ask(ledger, authorization_ref="auth_mail")
    ledger.revoke("auth_mail", by="t", reason="gone")
    with pytest.raises(OutOfScope):  # revoked and out of scope: still out of scope
        _ask(ledger, authorization_ref="auth_mail")
    ledger.grant(tenant="beta", scope=["*"], granted_by="t", ref="auth_beta")
    with pytest.raises(UnknownAuthorization):
        _ask(ledger, authorization_ref="auth_beta")
    with pytest.raises(UnknownAuthorization):
        _ask(ledger, authorization_ref="auth_nobody")


def test_the_adapters_intent_fields_decide_what_is_another_act(ledger: Ledger, grant: str) -> None:
    registry = Registry([CrmAdapter("http://127.0.0.1:9", account="acme")])
    assert registry.intent_fields("crm.update_case.v1") == ("fields",)
    assert registry.intent_fields("crm.close_case.v1") == ()
    published: list[str] = []
    effects = Effects(Ledger(ledger.engine, actions=registry), publish=published.append)

    def update(fields: dict[str, str], note: str, **kw: Any) -> EffectPending:
        result = effects.effect(
            tenant="acme",
            run="run-2",
            action="crm.update_case.v1",
            target="case-9",
            payload={"fields": fields, "note": note},
            authorization_ref=grant,
            **kw,
        )
        assert isinstance(result, EffectPending)
        return result

    high = update({"priority": "high"}, "escalated")
    assert update({"priority": "high"}, "escalated, reworded").op_id == high.op_id
    assert update({"priority": "high"}, "again").differs == ("payload.note",)
    low = update({"priority": "low"}, "escalated")  # what the update sets: another act
    assert low.op_id != high.op_id
    # the caller's own declaration wins over the adapter's
    by_note = update({"priority": "high"}, "n1", intent_fields=["note"])
    assert by_note.op_id not in (high.op_id, low.op_id)
    assert update({"priority": "low"}, "n1", intent_fields=["note"]).op_id == by_note.op_id
    # a purpose makes a deliberate repeat; your own step names the intent outright
    assert update({"priority": "high"}, "x", purpose="re-escalate").op_id != high.op_id
    mine = update({"priority": "high"}, "x", intent_key="my-own-key")
    assert mine.operation.intent_key == "my-own-key"
    with pytest.raises(InvalidInput):
        update({"priority": "high"}, "x", intent_key="k", purpose="p")
    wrong = CrmAdapter("http://127.0.0.1:9", account="acme")
    wrong.intent_fields = {"crm.refund.v1": ("amount",)}  # an action it does not serve
    with pytest.raises(ValueError, match="does not serve"):
        Registry([wrong])
