"""What each of the ledger's callers asks of it, and nothing more: one protocol each.

`Ledger` is one object on Postgres; its callers are written against the narrowest of
these, so a fake of a few methods can stand in for it:

- `WorkerLedger`: a worker (`opledger.tasks.worker.Worker`); the in-memory twin the unit
  tests run the worker on (`opledger.dev.memory.MemoryLedger`) satisfies it too;
- `IntentLedger`: an agent surface (`opledger.agents.Effects`, and through it the
  LangGraph tools and the MCP gateway): ask an intent, read and wait for its answer;
- `BeatLedger`: beat's tasks (the sweep, the relay, the payload purge);
- `GrantLedger`: grants, their revocation and reading them;
- `ReviewQueue`: the operator queue (`Ledger.reviews`) as the console and the CLI use it,
  `ApprovalDesk`: the approval requests a person decides, and `ConsoleLedger`: what the
  console is handed.

The guarantees behind each method (every write conditional on the fence and the claim's
token, the allowed status changes) live in the SQL and are tested against Postgres; a
fake keeps the same rules for the tests it serves. `tests/unit/test_facades.py` checks
that `Ledger` satisfies every protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from sqlalchemy import Engine

from .approvals import Approval, ApprovalDecision
from .backlog import Handout
from .beats import BeatSeen
from .contract import Limits
from .intents import Intent
from .models import (
    Answer,
    Asked,
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
from .providers import ProviderState
from .resolution import Resolution
from .reviews import ReviewAction, ReviewCount, ReviewSummary, ReviewView
from .switches import LedgerEpoch


@runtime_checkable
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
        wake: Callable[[str], None] | None = None,
        review: Mapping[str, Any] | None = None,
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
        review: Mapping[str, Any] | None = None,
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


@runtime_checkable
class IntentLedger(Protocol):
    """What an agent surface asks of the ledger (`opledger.agents.Effects`): the payload
    fields that make an act, asking an intent, reading its answer and waiting for it."""

    @property
    def engine(self) -> Engine:
        """The ledger's engine: the settle listener connects to the same database."""
        ...

    def intent_fields(self, action: str) -> tuple[str, ...]: ...

    def intent_scope(self, action: str) -> str: ...

    def ask_intent(
        self,
        intent: Intent,
        *,
        actor: str = ...,
        notify: bool = ...,
        traceparent: str | None = None,
    ) -> Asked: ...

    def payload(self, op_id: str) -> dict[str, Any] | None: ...

    def answer(self, op_id: str) -> Answer: ...

    def answers(self, op_ids: Iterable[str]) -> dict[str, Answer]: ...

    def watch(self, op_id: str) -> None: ...

    def beat_seen(self) -> BeatSeen:
        """The last beat seen: an answer about an operation waiting on the relay says
        when none has been seen for a while."""
        ...


@runtime_checkable
class BeatLedger(Protocol):
    """What beat asks of the ledger: its scheduler's heartbeat; for its tasks, notice a
    switch, expire leases, hand out the due checks and notifications, relay what was
    never dispatched, purge payloads."""

    def beat_heartbeat(self, *, host: str, pid: int, started_at: datetime) -> None: ...

    def check_switch(
        self, *, by: str = ..., terms: ClaimTerms | None = None, interval: timedelta | None = None
    ) -> LedgerEpoch | None: ...

    def expire_leases(
        self,
        *,
        limit: int = ...,
        backoff: timedelta = ...,
        actor: str = ...,
        interval: timedelta | None = None,
    ) -> list[str]: ...

    def hand_out_checks(
        self,
        *,
        limit: int = ...,
        backoff: timedelta,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = ...,
    ) -> list[Handout]: ...

    def due_notifications(
        self, *, limit: int = ..., backoff: timedelta, interval: timedelta | None = None
    ) -> list[str]: ...

    def due_approval_notifications(
        self, *, limit: int = ..., backoff: timedelta, interval: timedelta | None = None
    ) -> list[str]: ...

    def relay(
        self,
        *,
        older_than: timedelta,
        publish: Callable[[str, int], None],
        limit: int = ...,
        before_mark: Callable[[], None] | None = None,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = ...,
        max_doublings: int = ...,
    ) -> list[str]: ...

    def purge_payloads(self, *, older_than: timedelta, limit: int = ...) -> int: ...

    def defer(self, op_id: str, *, until: datetime) -> bool: ...


@runtime_checkable
class GrantLedger(Protocol):
    """Grants: given, revoked, read."""

    def grant(
        self,
        *,
        tenant: str,
        scope: Sequence[str],
        granted_by: str,
        ref: str | None = None,
        expires_at: datetime | None = None,
    ) -> Authorization: ...

    def revoke(self, ref: str, *, by: str, reason: str) -> Authorization: ...

    def authorization(self, ref: str) -> Authorization: ...


@runtime_checkable
class ReviewQueue(Protocol):
    """The operator review queue (`Ledger.reviews`, `opledger.ledger.reviews.Reviews`) as
    the console and `opledger review` use it, scoped per tenant."""

    def list(
        self,
        *,
        tenant: str,
        older_than: timedelta | None = None,
        action: str | None = None,
        reason: str | None = None,
        limit: int = ...,
    ) -> tuple[ReviewSummary, ...]: ...

    def counts(self, *, tenant: str) -> tuple[ReviewCount, ...]: ...

    def tenants_with_open_reviews(self) -> tuple[tuple[str, int], ...]: ...

    def search(
        self,
        *,
        tenant: str,
        op_id: str | None = None,
        workflow_id: str | None = None,
        target: str | None = None,
        limit: int = ...,
    ) -> tuple[Operation, ...]: ...

    def history(self, op_id: str, *, tenant: str) -> History: ...

    def payload(self, op_id: str, *, tenant: str) -> dict[str, Any] | None: ...

    def show(self, op_id: str, *, tenant: str, operator: str) -> ReviewView: ...

    def resolve(
        self,
        op_id: str,
        *,
        tenant: str,
        operator: str,
        resolution: Resolution | str,
        note: str,
        evidence: str | None = None,
        new_key: bool = False,
        seen_version: int | None = None,
        acknowledge_risk: bool = False,
        override_evidence: bool = False,
    ) -> Operation: ...

    def audit(self, op_id: str, *, tenant: str) -> tuple[ReviewAction, ...]: ...


@runtime_checkable
class ApprovalDesk(Protocol):
    """The approval requests a person decides (`opledger.ledger.approvals.Approvals`), as
    the console and `opledger approvals` use them. Each decision is one conditional
    statement of the ledger's: the caller decides nothing itself."""

    def approvals(
        self, *, tenant: str | None = None, status: str | None = ..., limit: int = ...
    ) -> tuple[Approval, ...]: ...

    def approval(self, op_id: str) -> Approval: ...

    def approval_decisions(self, op_id: str) -> tuple[ApprovalDecision, ...]: ...

    def approve(
        self,
        op_id: str,
        *,
        operator: str,
        digest: str,
        note: str | None = None,
        shown: Any = None,
    ) -> Approval: ...

    def deny(
        self, op_id: str, *, operator: str, digest: str, note: str, shown: Any = None
    ) -> Approval: ...


@runtime_checkable
class ConsoleLedger(ApprovalDesk, Protocol):
    """What the review console is handed: the review queue, the approval requests and the
    providers' pressure."""

    @property
    def reviews(self) -> ReviewQueue: ...

    def providers(self) -> list[ProviderState]: ...


__all__ = [
    "ApprovalDesk",
    "BeatLedger",
    "ConsoleLedger",
    "GrantLedger",
    "IntentLedger",
    "ReviewQueue",
    "WorkerLedger",
]
