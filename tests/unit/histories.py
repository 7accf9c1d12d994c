"""Builders for operations, attempts and evidence, for testing the pure retry decision."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from opledger.ledger import Attempt, Authorization, Binding, Claim, Evidence, Operation, Status

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
OP_ID = "op_01ARZ3NDEKTSV4RRFFQ69G5FAV"
#: the operation's idempotency key: derived from its intent ("opk_" + 26), never its id
KEY = "opk_7ZQ3M1XK9D4VB2N8C6RT0HJW5F"
DIGEST = "a" * 64


def operation(status: Status = Status.UNKNOWN, **changes: Any) -> Operation:
    base: dict[str, Any] = dict(
        id=OP_ID,
        tenant="acme",
        workflow_id="wf",
        intent_key="k",
        action="crm.close_case.v1",
        target="case-318",
        provider="crm",
        payload_digest=DIGEST,
        payload_size=10,
        authorization_ref="auth_acme",
        status=status,
        fence=1,
        lease_owner=None,
        lease_expires_at=None,
        idempotency_key=KEY,
        provider_result_id=None,
        evidence_checked_at=None,
        next_check_at=None,
        record_version=2,
        created_at=T0,
        updated_at=T0,
    )
    return Operation(**{**base, **changes})


def attempt(
    n: int = 1,
    started: datetime = T0,
    in_flight: timedelta = timedelta(seconds=20),
    outcome: str | None = "ambiguous",
    key: str = KEY,
) -> Attempt:
    return Attempt(
        op_id=OP_ID,
        n=n,
        fence=n,
        owner="w",
        idempotency_key=key,
        started_at=started,
        deadline_at=started + in_flight,
        finished_at=started + timedelta(seconds=1) if outcome else None,
        outcome=outcome,
        response=None,
        authorized_by=None,
    )


_ids = iter(range(1, 10**9))


def evidence(
    verdict: str,
    *,
    source: str = "lookup",
    at: datetime = T0,
    key: str | None = KEY,
    target: str | None = None,
    digest: str | None = None,
    receipt: str | None = None,
    attempt_n: int | None = None,
    **detail: Any,
) -> Evidence:
    return Evidence(
        id=next(_ids),
        op_id=OP_ID,
        attempt_n=attempt_n,
        fence=1,
        source=source,
        verdict=verdict,
        binding=Binding(
            idempotency_key=key, target=target, payload_digest=digest, receipt_id=receipt
        ),
        detail=detail,
        applied=False,
        recorded_at=at,
    )


def grant(revoked: bool = False) -> Authorization:
    return Authorization(
        ref="auth_acme",
        tenant="acme",
        scope=("crm.*",),
        granted_by="t",
        granted_at=T0 - timedelta(days=1),
        expires_at=None,
        revoked_at=T0 if revoked else None,
        revoked_by="sec" if revoked else None,
        revoke_reason="x" if revoked else None,
    )


def claim(n: int = 1) -> Claim:
    """A claim on `operation()`, attempt `n`, as a worker holds it (not issued by a ledger)."""
    return Claim(
        fence=n,
        token="t",
        owner="w",
        attempt_n=n,
        started_at=T0,
        deadline_at=T0 + timedelta(seconds=20),
        payload={},
        payload_canonical="{}",
        operation=operation(),
    )
