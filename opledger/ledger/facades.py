"""What a worker asks of the ledger, and nothing more: `WorkerLedger`.

The worker (`opledger.tasks.worker.Worker`) is written against this protocol, not against
`Ledger`: `Ledger` satisfies it, and so does the in-memory twin the unit tests run the
worker on (`opledger.dev.memory.MemoryLedger`). The guarantees behind each method (every
write conditional on the fence and the claim's token, the allowed status changes) live in
the SQL and are tested against Postgres; the twin keeps the same rules for the worker's
tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from .contract import Limits
from .models import (
    Authorization,
    Binding,
    Claim,
    ClaimTerms,
    Evidence,
    EvidenceSource,
    History,
    Operation,
    Outcome,
    Review,
    Status,
    Verdict,
)


class WorkerLedger(Protocol):
    """The ledger's methods a worker calls: claim, record, read, settle, schedule, review,
    defer; and for a review's notification, grant and prepare."""

    # -- the claim and the outcome (the worker's two hot statements) -----------------------

    def claim(self, op_id: str, *, owner: str, terms: ClaimTerms | None = None) -> Claim | None: ...

    def claim_retry(
        self,
        op_id: str,
        *,
        owner: str,
        expected_fence: int,
        authorized_by: str | None = None,
        terms: ClaimTerms | None = None,
    ) -> Claim | None: ...

    def record_outcome(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        recheck: timedelta = ...,
        limits: Limits | None = None,
    ) -> Operation: ...

    def defer(self, op_id: str, *, until: datetime) -> bool: ...

    # -- reads -------------------------------------------------------------------------------

    def get(self, op_id: str) -> Operation: ...

    def history(self, op_id: str) -> History: ...

    def authorization(self, ref: str) -> Authorization: ...

    # -- reconciliation ----------------------------------------------------------------------

    def record_evidence(
        self,
        op_id: str,
        *,
        source: EvidenceSource | str,
        verdict: Verdict | str,
        binding: Binding | None = None,
        detail: Mapping[str, Any] | None = None,
        attempt_n: int | None = None,
        fence: int | None = None,
    ) -> Evidence: ...

    def settle(
        self,
        op_id: str,
        *,
        fence: int,
        to: Status,
        evidence_id: int,
        actor: str,
        reason: str,
        receipt_id: str | None = None,
    ) -> Operation: ...

    def schedule_check(self, op_id: str, *, fence: int, at: datetime) -> Operation: ...

    def open_review(
        self, op_id: str, *, fence: int, reason: str, snapshot: Mapping[str, Any] | None = None
    ) -> Review | None: ...

    # -- a review's notification (an operation of its own) -------------------------------

    def grant(
        self,
        *,
        tenant: str,
        scope: Sequence[str],
        granted_by: str,
        ref: str | None = None,
        expires_at: datetime | None = None,
    ) -> Authorization: ...

    def prepare(
        self,
        *,
        tenant: str,
        workflow_id: str,
        intent_key: str,
        action: str,
        target: str,
        payload: Mapping[str, Any],
        authorization_ref: str,
        actor: str = ...,
        traceparent: str | None = None,
    ) -> Operation: ...

    def mark_notified(self, review_id: int) -> None: ...


__all__ = ["WorkerLedger"]
