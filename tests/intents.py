"""Shared by every test that prepares an operation: `Ledger.prepare`'s keyword arguments
as typed dicts (so the type checker holds each variant to the signature), and the one
factory the modules prepare their operations with.

The suite's usual intent: tenant acme closes case-<key> (payload `{"note": "resolved"}`)
in workflow wf, under the authorization auth_acme — the `grant` fixture's, or one a
test's own ledger grants under that ref. A test changes only what it relies on:

    prepare(ledger, "c", action="email.send.v1")
    prepare(ledger, "smtp", **smtp_mail())
    prepare(ledger, "kept", traceparent=ORIGIN)
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import text

from opledger.ledger import Binding, Confirmed, Ledger, Operation
from opledger.ledger.ids import intent_idempotency_key

TENANT = "acme"
#: the `grant` fixture's ref (and the ref the tests' own ledgers grant under)
AUTHORIZATION = "auth_acme"
ACTION = "crm.close_case.v1"


class Intent(TypedDict):
    """Everything `Ledger.prepare` must be told: `ledger.prepare(**intent)`."""

    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    payload: Mapping[str, Any]
    authorization_ref: str


class Change(TypedDict, total=False):
    """Some of an intent's fields, changed: `ledger.prepare(**(intent | change))`."""

    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    payload: Mapping[str, Any]
    authorization_ref: str


def intent(key: str, **change: Unpack[Change]) -> Intent:
    """The usual intent under `key`, with `change` applied."""
    usual = Intent(
        tenant=TENANT,
        workflow_id="wf",
        intent_key=key,
        action=ACTION,
        target=f"case-{key}",
        payload={"note": "resolved"},
        authorization_ref=AUTHORIZATION,
    )
    return usual | change


def prepare_op(
    ledger: Ledger,
    key: str,
    *,
    after: Sequence[str] = (),
    traceparent: str | None = None,
    **change: Unpack[Change],
) -> Operation:
    """`ledger.prepare` of the usual intent under `key`, with `change` applied."""
    return ledger.prepare(**intent(key, **change), after=after, traceparent=traceparent)


def prepare(
    ledger: Ledger,
    key: str,
    *,
    after: Sequence[str] = (),
    traceparent: str | None = None,
    **change: Unpack[Change],
) -> str:
    """The id of `prepare_op(ledger, key, ...)`: what most tests hold on to."""
    return prepare_op(ledger, key, after=after, traceparent=traceparent, **change).id


def prepare_isolated(ledger: Ledger, key: str, *, expires_at: datetime | None = None) -> str:
    """The usual intent in a workflow of its own, under a grant of its own (acme's crm.*
    actions, expiring at `expires_at`): tests that share a database without truncating it
    never see each other's rows, and a grant can expire or be revoked for one operation."""
    unique = uuid.uuid4().hex[:12]
    grant = ledger.grant(
        tenant=TENANT,
        scope=["crm.*"],
        granted_by="test",
        ref=f"auth_isolated_{unique}",
        expires_at=expires_at,
    )
    return prepare(ledger, key, workflow_id=f"isolated-{unique}", authorization_ref=grant.ref)


def key_of(ledger: Ledger, op_id: str) -> str:
    """The idempotency key a provider sees for operation `op_id` (derived from its intent,
    never its id): where the sandbox counts its requests and effects (`crm:<key>`)."""
    return ledger.get(op_id).idempotency_key


def derived_key(ledger: Ledger, asked: Intent) -> str:
    """The key `ledger` derives for the intent `asked`, computed independently of `prepare`."""
    return intent_idempotency_key(
        ledger._store.key_namespace(),
        tenant=asked["tenant"],
        workflow_id=asked["workflow_id"],
        action=asked["action"],
        intent_key=asked["intent_key"],
    )


def smtp_mail(subject: str = "s", text: str = "t") -> Change:
    """An email to acme's owner over SMTP: the action, target and payload to change."""
    return Change(
        action="email.smtp_send.v1",
        target="owner@acme.test",
        payload={"to": "owner@acme.test", "subject": subject, "text": text},
    )


def settle(ledger: Ledger, op_id: str) -> None:
    claim = ledger.claim(op_id, owner="w")
    assert claim is not None
    ledger.record_outcome(
        claim, Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))
    )


def age(ledger: Ledger, op_id: str, seconds: float, column: str = "created_at") -> None:
    """Move one of `op_id`'s timestamps `seconds` into the past (an operation prepared, or
    a check due, that long ago)."""
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE operations SET {column} = now() - make_interval(secs => :s) WHERE id = :id"
            ),
            {"s": seconds, "id": op_id},
        )
