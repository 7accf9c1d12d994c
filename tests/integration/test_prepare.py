"""prepare: idempotent per intent, conflicts refused, outbox joins the caller's transaction."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session

from opledger.ledger import (
    AuthorizationRevoked,
    IntentConflict,
    Ledger,
    OutOfScope,
    Status,
    UnknownAuthorization,
)
from tests.intents import Change, Intent, derived_key

CLOSE = Intent(
    tenant="acme",
    workflow_id="onboarding-42",
    intent_key="close-case",
    action="crm.close_case.v1",
    target="case-318",
    payload={"status": "closed", "note": "done"},
    authorization_ref="auth_acme",
)


def count(ledger: Ledger, table: str) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def test_prepare_records_the_operation_before_anything_else(ledger: Ledger, grant: str) -> None:
    op = ledger.prepare(**CLOSE)
    assert op.id.startswith("op_") and len(op.id) == 29
    assert op.status is Status.PREPARED
    assert op.fence == 0
    assert op.provider == "crm"
    assert op.idempotency_key == derived_key(ledger, CLOSE)  # from the intent, not the id
    assert op.idempotency_key.startswith("opk_") and len(op.idempotency_key) == 30
    assert op.created_at.tzinfo is not None
    assert ledger.payload(op.id) == {"note": "done", "status": "closed"}
    history = ledger.history(op.id)
    assert [(t.from_status, t.to_status) for t in history.transitions] == [(None, Status.PREPARED)]


def test_the_same_call_again_returns_the_same_operation(ledger: Ledger, grant: str) -> None:
    first = ledger.prepare(**CLOSE)
    again = ledger.prepare(**(CLOSE | {"payload": {"note": "done", "status": "closed"}}))
    assert again.id == first.id
    assert count(ledger, "operations") == 1
    assert count(ledger, "transitions") == 1


@pytest.mark.parametrize(
    "change",
    [
        {"action": "crm.update_case.v1"},
        {"target": "case-319"},
        {"payload": {"status": "closed", "note": "changed"}},
    ],
    ids=["action", "target", "payload"],
)
def test_a_changed_intent_under_the_same_key_is_a_conflict(
    ledger: Ledger, grant: str, change: Change
) -> None:
    first = ledger.prepare(**CLOSE)
    with pytest.raises(IntentConflict) as info:
        ledger.prepare(**(CLOSE | change))
    assert info.value.fields["op_id"] == first.id
    assert count(ledger, "operations") == 1
    assert ledger.get(first.id).payload_digest == first.payload_digest


def test_a_different_authorization_under_the_same_key_is_a_conflict(
    ledger: Ledger, grant: str
) -> None:
    ledger.grant(tenant="acme", scope=["crm.*"], granted_by="test", ref="auth_other")
    ledger.prepare(**CLOSE)
    with pytest.raises(IntentConflict):
        ledger.prepare(**(CLOSE | {"authorization_ref": "auth_other"}))


def test_identical_actions_under_two_intents_stay_two_operations(
    ledger: Ledger, grant: str
) -> None:
    a = ledger.prepare(**(CLOSE | {"intent_key": "email-owner-1"}))
    b = ledger.prepare(**(CLOSE | {"intent_key": "email-owner-2"}))
    assert a.id != b.id
    assert a.payload_digest == b.payload_digest
    assert count(ledger, "operations") == 2


def test_the_same_intent_key_in_another_workflow_or_tenant_is_another_operation(
    ledger: Ledger, grant: str
) -> None:
    ledger.grant(tenant="globex", scope=["crm.*"], granted_by="test", ref="auth_globex")
    a = ledger.prepare(**CLOSE)
    b = ledger.prepare(**(CLOSE | {"workflow_id": "onboarding-43"}))
    c = ledger.prepare(**(CLOSE | {"tenant": "globex", "authorization_ref": "auth_globex"}))
    assert len({a.id, b.id, c.id}) == 3


def test_outbox_rolled_back_with_the_callers_transaction(ledger: Ledger, grant: str) -> None:
    with Session(ledger.engine) as session:
        session.execute(text("CREATE TEMP TABLE business (id int)"))
        session.execute(text("INSERT INTO business VALUES (1)"))
        op = ledger.prepare(**CLOSE, session=session)
        assert op.status is Status.PREPARED
        session.rollback()
    assert count(ledger, "operations") == 0
    assert count(ledger, "operation_payloads") == 0
    assert count(ledger, "transitions") == 0


def test_outbox_committed_with_the_callers_transaction(ledger: Ledger, grant: str) -> None:
    with Session(ledger.engine) as session:
        op = ledger.prepare(**CLOSE, session=session)
        # not visible to anyone else before the caller commits
        with ledger.engine.connect() as other:
            seen = other.execute(text("SELECT count(*) FROM operations")).scalar_one()
        assert seen == 0
        session.commit()
    assert ledger.get(op.id).status is Status.PREPARED
    assert ledger.payload(op.id) == CLOSE["payload"]


def test_prepare_refuses_unknown_foreign_revoked_or_out_of_scope_grants(
    ledger: Ledger, grant: str
) -> None:
    with pytest.raises(UnknownAuthorization):
        ledger.prepare(**(CLOSE | {"authorization_ref": "auth_missing"}))
    ledger.grant(tenant="globex", scope=["crm.*"], granted_by="test", ref="auth_globex")
    with pytest.raises(UnknownAuthorization):
        ledger.prepare(**(CLOSE | {"authorization_ref": "auth_globex"}))
    ledger.grant(tenant="acme", scope=["email.*"], granted_by="test", ref="auth_mail")
    with pytest.raises(OutOfScope):
        ledger.prepare(**(CLOSE | {"authorization_ref": "auth_mail"}))
    ledger.revoke("auth_acme", by="test", reason="rotated")
    with pytest.raises(AuthorizationRevoked):
        ledger.prepare(**CLOSE)
    assert count(ledger, "operations") == 0


def test_grant_is_idempotent_and_revoke_keeps_the_first_revocation(ledger: Ledger) -> None:
    g1 = ledger.grant(tenant="acme", scope=["crm.*"], granted_by="alice", ref="auth_x")
    g2 = ledger.grant(tenant="acme", scope=["crm.*"], granted_by="alice", ref="auth_x")
    assert g1 == g2
    r1 = ledger.revoke("auth_x", by="bob", reason="left the company")
    r2 = ledger.revoke("auth_x", by="carol", reason="again")
    assert r1.revoked_at is not None and r2.revoked_by == "bob"
    with pytest.raises(UnknownAuthorization):
        ledger.revoke("auth_nope", by="bob", reason="x")


def test_authorizations_lists_grants_newest_first_revoked_ones_too(ledger: Ledger) -> None:
    assert ledger.authorizations() == ()
    ledger.grant(tenant="acme", scope=["crm.*"], granted_by="alice", ref="auth_a")
    ledger.grant(tenant="globex", scope=["email.*"], granted_by="alice", ref="auth_g")
    ledger.grant(tenant="acme", scope=["email.*"], granted_by="alice", ref="auth_b")
    ledger.revoke("auth_a", by="bob", reason="rotated")
    assert [g.ref for g in ledger.authorizations()] == ["auth_b", "auth_g", "auth_a"]
    acme = ledger.authorizations(tenant="acme")
    assert [(g.ref, g.revoked_by) for g in acme] == [("auth_b", None), ("auth_a", "bob")]
    assert acme[1].scope == ("crm.*",)
    assert [g.ref for g in ledger.authorizations(tenant="acme", limit=1)] == ["auth_b"]
    assert ledger.authorizations(tenant="initech") == ()
