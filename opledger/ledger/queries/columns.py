"""The columns every statement returns for an operation and a grant, and the one SQL
spelling of "the grant is active".
"""

from __future__ import annotations


def columns_of(alias: str) -> str:
    return ", ".join(f"{alias}.{c}" for c in OPERATION_COLUMNS)


OPERATION_COLUMNS = (
    "id",
    "tenant",
    "workflow_id",
    "intent_key",
    "action",
    "target",
    "provider",
    "payload_digest",
    "payload_size",
    "authorization_ref",
    "status",
    "fence",
    "lease_owner",
    "lease_expires_at",
    "idempotency_key",
    "provider_result_id",
    "evidence_checked_at",
    "next_check_at",
    "operator_retry_by",
    "traceparent",
    "waiting_on",
    "intent_scope",
    "record_version",
    "created_at",
    "updated_at",
)


def grant_active(alias: str) -> str:
    """Whether the grant `alias` is active now: the one SQL spelling of the rule that
    `Authorization.active_at` states in Python."""
    a = alias
    return f"({a}.revoked_at IS NULL AND ({a}.expires_at IS NULL OR {a}.expires_at > now()))"


AUTH_COLUMNS = (
    "a.ref, a.tenant, a.scope, a.granted_by, a.granted_at, a.expires_at, a.revoked_at, "
    f"a.revoked_by, a.revoke_reason, {grant_active('a')} AS active"
)
