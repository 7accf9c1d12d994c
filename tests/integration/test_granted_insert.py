"""A new intent under a good grant is recorded in one statement that checks the grant
itself (`queries.INSERT_GRANTED_OPERATION`), where the full path checks it in Python
(`grants._check_grant`). The statement must never record what that check refuses (its
refusal would be skipped: nothing else looks), and should record what it allows (else
every ask pays the full path's round trips). Real Postgres."""

from __future__ import annotations

import fnmatch
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opledger.ledger import (
    AuthorizationRevoked,
    InvalidInput,
    Ledger,
    OutOfScope,
    UnknownAuthorization,
)
from opledger.ledger.canonical import canonicalize
from tests.intents import intent


def _values(ref: str, action: str, tenant: str = "acme") -> dict[str, Any]:
    frozen = canonicalize({"n": 1})
    return {
        "tenant": tenant,
        "workflow_id": "granted",
        "intent_key": uuid.uuid4().hex,
        "intent_scope": "run",
        "action": action,
        "target": "case-1",
        "provider": "crm",
        "payload_digest": frozen.digest,
        "payload_size": frozen.size,
        "authorization_ref": ref,
        "actor": "test",
        "waiting_on": 0,
        "notify_settle": False,
        "traceparent": None,
        "asked_by": None,
        "record_ask": True,
        "idempotency_key": "opk_" + uuid.uuid4().hex[:26].upper(),
    }


def _grant(ledger: Ledger, scope: list[str], **kw: Any) -> str:
    ref = f"auth_{uuid.uuid4().hex[:12]}"
    return ledger.grant(tenant="acme", scope=scope, granted_by="test", ref=ref, **kw).ref


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pattern=st.text(alphabet="ab._*", min_size=1, max_size=6),
    action=st.text(alphabet="ab._", min_size=1, max_size=6),
)
def test_the_statement_admits_exactly_what_the_grant_check_admits(
    ledger: Ledger, pattern: str, action: str
) -> None:
    try:
        ref = _grant(ledger, [pattern])
    except InvalidInput:
        assume(False)  # not a pattern a grant can hold
    recorded = ledger._insert_granted(_values(ref, action), '{"n":1}')
    assert (recorded is not None) == fnmatch.fnmatchcase(action, pattern), (pattern, action)


def test_no_grant_in_force_no_record(ledger: Ledger) -> None:
    good = _grant(ledger, ["crm.*"])
    assert ledger._insert_granted(_values(good, "crm.close_case.v1"), "{}") is not None
    assert ledger._insert_granted(_values(good, "email.send.v1"), "{}") is None
    assert ledger._insert_granted(_values(good, "crm.close_case.v1", "other"), "{}") is None
    assert ledger._insert_granted(_values("auth_nothing", "crm.close_case.v1"), "{}") is None
    revoked = _grant(ledger, ["crm.*"])
    ledger.revoke(revoked, by="test", reason="test")
    assert ledger._insert_granted(_values(revoked, "crm.close_case.v1"), "{}") is None
    expired = _grant(ledger, ["crm.*"], expires_at=datetime.now(UTC) + timedelta(seconds=1))
    with ledger.engine.begin() as conn:  # expired a minute ago
        conn.exec_driver_sql(
            "UPDATE authorizations SET expires_at = now() - interval '1 minute' WHERE ref = %s",
            (expired,),
        )
    assert ledger._insert_granted(_values(expired, "crm.close_case.v1"), "{}") is None
    again = _values(good, "crm.close_case.v1")
    assert ledger._insert_granted(again, "{}") is not None
    assert ledger._insert_granted(again, "{}") is None  # the intent is recorded already


@pytest.mark.parametrize(
    ("scope", "tenant", "revoke", "error"),
    [
        (["email.*"], "acme", False, OutOfScope),
        (["crm.*"], "other", False, UnknownAuthorization),
        (["crm.*"], "acme", True, AuthorizationRevoked),
    ],
)
def test_what_the_statement_does_not_record_the_full_path_refuses_by_name(
    ledger: Ledger, scope: list[str], tenant: str, revoke: bool, error: type[Exception]
) -> None:
    ref = _grant(ledger, scope)
    if revoke:
        ledger.revoke(ref, by="test", reason="test")
    with pytest.raises(error):
        ledger.prepare(**intent("refused", tenant=tenant, authorization_ref=ref))
