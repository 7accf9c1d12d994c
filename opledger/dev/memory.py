"""An in-memory twin of the ledger, for the worker's unit tests: `MemoryLedger`.

It implements what a worker asks of the ledger (`opledger.ledger.facades.WorkerLedger`)
over dictionaries, on a clock the test moves, so step orchestration, review set-ups and
adapter behaviour run in milliseconds without Postgres. It keeps operations, attempts,
evidence, transitions and reviews; fences and claim tokens; leases; and the status changes
the ledger allows (`models.ALLOWED_TRANSITIONS`, which the database's guard enforces): a
write under a stale fence or a foreign claim is refused as the SQL refuses it, with the
outcome of a fenced-out claim still kept as evidence.

What it leaves out, on purpose: provider limits and the breaker (a claim is never
`ProviderBusy`), dependencies, payload sealing, epochs and switches, and transactions. The
guarantees the SQL gives (every write conditional on the fence, the guard trigger, the
hot statements) are tested against Postgres (`tests/integration/test_guards.py`,
`test_claims.py`); `tests/unit/test_worker.py` checks that this twin and the ledger agree
on a worker's path.
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from opledger.ledger import (
    Attempt,
    Authorization,
    AuthorizationRevoked,
    Binding,
    Claim,
    ClaimTerms,
    Confirmed,
    Evidence,
    EvidenceSource,
    ForbiddenTransition,
    History,
    Operation,
    OperationNotFound,
    Outcome,
    Review,
    StaleFence,
    Status,
    Transition,
    UnknownAuthorization,
    Verdict,
)
from opledger.ledger.canonical import canonicalize
from opledger.ledger.contract import Limits
from opledger.ledger.evidence import admit
from opledger.ledger.ids import intent_idempotency_key, new_operation_id
from opledger.ledger.models import ALLOWED_TRANSITIONS

#: the send-by window of a claim whose terms name none for its provider
DEFAULT_SEND_WINDOW = timedelta(seconds=30)


class FakeClock:
    """A clock the test moves: `clock()` is now, `clock.advance(...)` moves it on."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, by: timedelta | float) -> None:
        self.now += by if isinstance(by, timedelta) else timedelta(seconds=by)


@dataclass
class _Row:
    """One operation and everything recorded about it."""

    op: Operation
    payload: str
    token: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    tokens: dict[int, str] = field(default_factory=dict)  #: each attempt's claim token
    evidence: list[Evidence] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    reviews: list[Review] = field(default_factory=list)


class MemoryLedger:
    """What a worker asks of the ledger (`WorkerLedger`), in memory, on `clock`.

    `provider_for(action)` names an action's provider (the adapter registry's does)."""

    def __init__(
        self,
        provider_for: Callable[[str], str] = lambda action: action.split(".", 1)[0],
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.provider_for = provider_for
        self.clock = clock or FakeClock()
        self._rows: dict[str, _Row] = {}
        self._intents: dict[tuple[str, str, str], str] = {}
        self._grants: dict[str, Authorization] = {}
        self._ids = itertools.count(1)

    # -- grants and prepare --------------------------------------------------------------

    def grant(
        self,
        *,
        tenant: str,
        scope: Sequence[str],
        granted_by: str,
        ref: str | None = None,
        expires_at: datetime | None = None,
    ) -> Authorization:
        ref = ref or f"auth_{next(self._ids)}"
        if ref in self._grants:
            return self._grants[ref]
        grant = Authorization(
            ref=ref,
            tenant=tenant,
            scope=tuple(scope),
            granted_by=granted_by,
            granted_at=self.clock(),
            expires_at=expires_at,
            revoked_at=None,
            revoked_by=None,
            revoke_reason=None,
        )
        self._grants[ref] = grant
        return grant

    def revoke(self, ref: str, *, by: str = "test", reason: str = "revoked") -> None:
        grant = self.authorization(ref)
        self._grants[ref] = grant.model_copy(
            update={"revoked_at": self.clock(), "revoked_by": by, "revoke_reason": reason}
        )

    def authorization(self, ref: str) -> Authorization:
        try:
            return self._grants[ref]
        except KeyError:
            raise UnknownAuthorization(f"no authorization {ref!r}", ref=ref) from None

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
        actor: str = "prepare",
        traceparent: str | None = None,
    ) -> Operation:
        known = self._intents.get((tenant, workflow_id, intent_key))
        if known is not None:
            return self.get(known)
        if not self.authorization(authorization_ref).active_at(self.clock()):
            raise AuthorizationRevoked(f"{authorization_ref!r} is not active")
        canonical = canonicalize(payload)
        now = self.clock()
        op = Operation(
            id=new_operation_id(),
            tenant=tenant,
            workflow_id=workflow_id,
            intent_key=intent_key,
            action=action,
            target=target,
            provider=self.provider_for(action),
            payload_digest=canonical.digest,
            payload_size=canonical.size,
            authorization_ref=authorization_ref,
            status=Status.PREPARED,
            fence=0,
            lease_owner=None,
            lease_expires_at=None,
            idempotency_key=intent_idempotency_key(
                "memory",
                tenant=tenant,
                workflow_id=workflow_id,
                action=action,
                intent_key=intent_key,
            ),
            provider_result_id=None,
            evidence_checked_at=None,
            next_check_at=None,
            traceparent=traceparent,
            record_version=1,
            created_at=now,
            updated_at=now,
        )
        row = self._rows[op.id] = _Row(op=op, payload=canonical.text)
        self._transition(row, None, Status.PREPARED, actor, "prepared")
        self._intents[(tenant, workflow_id, intent_key)] = op.id
        return op

    # -- reads ---------------------------------------------------------------------------

    def _row(self, op_id: str) -> _Row:
        try:
            return self._rows[op_id]
        except KeyError:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id) from None

    def get(self, op_id: str) -> Operation:
        return self._row(op_id).op

    def history(self, op_id: str) -> History:
        row = self._row(op_id)
        return History(
            operation=row.op,
            attempts=tuple(row.attempts),
            evidence=tuple(row.evidence),
            transitions=tuple(row.transitions),
            reviews=tuple(row.reviews),
        )

    # -- the status's one door: the guard's rules --------------------------------------------

    def _transition(
        self, row: _Row, was: Status | None, to: Status, actor: str, reason: str
    ) -> None:
        if was is not None and was != to and (was, to) not in ALLOWED_TRANSITIONS:
            raise ForbiddenTransition(f"{row.op.id}: {was} -> {to} is not allowed")
        if was != to:
            row.transitions.append(
                Transition(
                    id=next(self._ids),
                    op_id=row.op.id,
                    from_status=was,
                    to_status=to,
                    fence=row.op.fence,
                    actor=actor,
                    reason=reason,
                    at=self.clock(),
                )
            )

    def _move(self, row: _Row, actor: str, reason: str, **changes: Any) -> Operation:
        """Change the operation as the guard allows: a listed status change, a fence that
        never goes back; audited."""
        was = row.op
        if changes.get("fence", was.fence) < was.fence:
            raise ForbiddenTransition(f"{was.id}: the fence never goes back")
        row.op = was.model_copy(
            update={**changes, "record_version": was.record_version + 1, "updated_at": self.clock()}
        )
        self._transition(row, was.status, row.op.status, actor, reason)
        return row.op

    def _moved(self, row: _Row, fence: int) -> NoReturn:
        raise StaleFence(
            f"{row.op.id} moved since fence {fence} (now {row.op.status}, fence {row.op.fence})",
            op_id=row.op.id,
            fence=fence,
            current_fence=row.op.fence,
            evidence_kept=False,
        )

    # -- the claim and the outcome -----------------------------------------------------------

    def claim(self, op_id: str, *, owner: str, terms: ClaimTerms | None = None) -> Claim | None:
        """A prepared operation's first claim: fence + 1, a lease, an attempt; None when it
        is not prepared (claimed already, finished). A revoked grant cancels it."""
        row = self._row(op_id)
        if row.op.status is not Status.PREPARED:
            return None
        if not self._active(row):
            self._move(
                row, owner, "authorization revoked", status=Status.CANCELLED, fence=row.op.fence + 1
            )
            raise AuthorizationRevoked(f"the grant of {op_id} is no longer active", op_id=op_id)
        return self._take(row, owner, terms or ClaimTerms(), "claimed")

    def claim_retry(
        self,
        op_id: str,
        *,
        owner: str,
        expected_fence: int,
        authorized_by: str | None = None,
        terms: ClaimTerms | None = None,
    ) -> Claim | None:
        """Claim an unknown operation again at the fence the decision saw; None when it
        moved since."""
        row = self._row(op_id)
        if row.op.status is not Status.UNKNOWN or row.op.fence != expected_fence:
            return None
        if authorized_by is None and not self._active(row):
            raise AuthorizationRevoked(f"the grant of {op_id} is no longer active", op_id=op_id)
        return self._take(row, owner, terms or ClaimTerms(), "retry", authorized_by)

    def _active(self, row: _Row) -> bool:
        return self.authorization(row.op.authorization_ref).active_at(self.clock())

    def _take(
        self,
        row: _Row,
        owner: str,
        terms: ClaimTerms,
        reason: str,
        authorized_by: str | None = None,
    ) -> Claim:
        now, provider = self.clock(), row.op.provider
        window = terms.send_window_by_provider.get(provider, terms.send_window)
        window = window or DEFAULT_SEND_WINDOW
        in_flight = terms.in_flight_by_provider.get(provider, terms.in_flight) or terms.lease
        token = secrets.token_hex(16)
        op = self._move(
            row,
            owner,
            reason,
            status=Status.DISPATCHING,
            fence=row.op.fence + 1,
            lease_owner=owner,
            lease_expires_at=now + terms.lease,
            next_check_at=None,
            operator_retry_by=None,
        )
        row.token = token
        attempt = Attempt(
            op_id=op.id,
            n=len(row.attempts) + 1,
            fence=op.fence,
            owner=owner,
            idempotency_key=op.idempotency_key,
            started_at=now,
            deadline_at=now + in_flight + window,
            finished_at=None,
            outcome=None,
            response=None,
            authorized_by=authorized_by,
            send_by=now + window,
        )
        row.attempts.append(attempt)
        row.tokens[attempt.n] = token
        return Claim(
            fence=op.fence,
            token=token,
            owner=owner,
            attempt_n=attempt.n,
            started_at=now,
            deadline_at=attempt.deadline_at,
            db_now=now,
            send_by=attempt.send_by,
            payload=json.loads(row.payload),
            payload_canonical=row.payload,
            operation=op,
        )

    def record_outcome(
        self,
        claim: Claim,
        outcome: Outcome,
        *,
        recheck: timedelta = timedelta(0),
        limits: Limits | None = None,
        wake: Callable[[str], None] | None = None,
        review: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Close the claim's attempt, keep the evidence, move the status; under a stale
        fence the evidence is kept and `StaleFence` raised (`evidence_kept`, `status`).
        No slots here (the module's docstring), so nothing waits for one: `wake` is never
        called. `review` opens a review of a possible duplicate when it confirms."""
        row = self._row(claim.op_id)
        outcome = admit(None, claim, outcome)
        open_ = self._finish_attempt(row, claim, outcome)
        holds = (
            open_
            and row.op.fence == claim.fence
            and row.token == claim.token
            and row.op.status is Status.DISPATCHING
        )
        if open_:
            binding = (
                outcome.binding
                if isinstance(outcome, Confirmed)
                else Binding(idempotency_key=claim.idempotency_key)
            )
            self._evidence(
                row,
                EvidenceSource.DISPATCH,
                Verdict(outcome.kind),
                binding,
                dict(outcome.detail),
                claim.attempt_n,
                claim.fence,
                applied=holds,
            )
        if not holds:
            raise StaleFence(
                f"claim on {claim.op_id} with fence {claim.fence} no longer holds it",
                op_id=claim.op_id,
                fence=claim.fence,
                current_fence=row.op.fence,
                evidence_kept=open_,
                status=row.op.status.value,
            )
        to = {"confirmed": Status.CONFIRMED, "rejected": Status.REJECTED}.get(
            outcome.kind, Status.UNKNOWN
        )
        row.token = None
        receipt = outcome.receipt_id if isinstance(outcome, Confirmed) else None
        moved = self._move(
            row,
            claim.owner,
            f"{outcome.kind}",
            status=to,
            lease_owner=None,
            lease_expires_at=None,
            provider_result_id=receipt or row.op.provider_result_id,
            evidence_checked_at=self.clock(),
            next_check_at=self.clock() + recheck if to is Status.UNKNOWN else None,
        )
        if review is not None and to is Status.CONFIRMED:
            self._open(row, str(review.get("reason") or "possible_duplicate")[:2000], review)
        return moved

    def _finish_attempt(self, row: _Row, claim: Claim, outcome: Outcome) -> bool:
        """Close the claim's attempt with `outcome`; whether it was still open."""
        at = next(
            (
                i
                for i, a in enumerate(row.attempts)
                if a.fence == claim.fence and row.tokens.get(a.n) == claim.token
            ),
            None,
        )
        if at is None or row.attempts[at].finished_at is not None:
            return False
        row.attempts[at] = row.attempts[at].model_copy(
            update={
                "finished_at": self.clock(),
                "outcome": outcome.kind,
                "response": outcome.model_dump(mode="json"),
            }
        )
        return True

    def defer(self, op_id: str, *, until: datetime) -> bool:
        row = self._row(op_id)
        if row.op.status is not Status.PREPARED:
            return False
        row.op = row.op.model_copy(update={"next_check_at": until})
        return True

    def expire_leases(self, *, actor: str = "sweeper") -> list[str]:
        """Fence out claims whose lease expired: dispatching -> unknown, fence + 1."""
        now, expired = self.clock(), []
        for row in self._rows.values():
            op = row.op
            if (
                op.status is Status.DISPATCHING
                and op.lease_expires_at
                and op.lease_expires_at <= now
            ):
                row.token = None
                self._move(
                    row,
                    actor,
                    "lease expired",
                    status=Status.UNKNOWN,
                    fence=op.fence + 1,
                    lease_owner=None,
                    lease_expires_at=None,
                    next_check_at=now,
                )
                expired.append(op.id)
        return expired

    # -- reconciliation ----------------------------------------------------------------------

    def _evidence(
        self,
        row: _Row,
        source: EvidenceSource,
        verdict: Verdict,
        binding: Binding,
        detail: dict[str, Any],
        attempt_n: int | None,
        fence: int | None,
        *,
        applied: bool = False,
    ) -> Evidence:
        evidence = Evidence(
            id=next(self._ids),
            op_id=row.op.id,
            attempt_n=attempt_n,
            fence=fence,
            source=source,
            verdict=verdict,
            binding=binding,
            detail=detail,
            applied=applied,
            recorded_at=self.clock(),
        )
        row.evidence.append(evidence)
        return evidence

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
    ) -> Evidence:
        return self._evidence(
            self._row(op_id),
            EvidenceSource(source),
            Verdict(verdict),
            binding or Binding(),
            dict(detail or {}),
            attempt_n,
            fence,
        )

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
    ) -> Operation:
        """`review` (a possible duplicate, confirming only): the open review becomes it
        (reason replaced, snapshot merged, notified anew), or one is opened."""
        row = self._row(op_id)
        if to not in (Status.CONFIRMED, Status.REJECTED):
            raise ForbiddenTransition(f"settle moves to confirmed or rejected, not {to}")
        if row.op.fence != fence or row.op.status is not Status.UNKNOWN:
            self._moved(row, fence)
        row.evidence = [
            e.model_copy(update={"applied": True}) if e.id == evidence_id else e
            for e in row.evidence
        ]
        duplicate = review if to is Status.CONFIRMED else None
        why = str((duplicate or {}).get("reason") or "possible_duplicate")[:2000]
        for i, r in enumerate(row.reviews):
            if r.resolved_at is not None:
                continue
            row.reviews[i] = r.model_copy(
                update={
                    "reason": why,
                    "snapshot": {
                        **r.snapshot,
                        **duplicate,
                        "review_before": {"reason": r.reason, "opened_at": r.opened_at.isoformat()},
                    },
                    "notified_at": None,
                }
                if duplicate is not None
                else {
                    "resolution": to.value,
                    "resolved_by": actor,
                    "resolved_at": self.clock(),
                    "note": reason,
                }
            )
        if duplicate is not None:
            self._open(row, why, duplicate)  # none open: one opened (else turned above)
        return self._move(
            row,
            actor,
            reason,
            status=to,
            fence=fence + 1,
            next_check_at=None,
            evidence_checked_at=self.clock(),
            provider_result_id=receipt_id or row.op.provider_result_id,
        )

    def schedule_check(self, op_id: str, *, fence: int, at: datetime) -> Operation:
        row = self._row(op_id)
        if row.op.fence != fence or row.op.status is not Status.UNKNOWN:
            self._moved(row, fence)
        row.op = row.op.model_copy(update={"next_check_at": at, "updated_at": self.clock()})
        return row.op

    def open_review(
        self, op_id: str, *, fence: int, reason: str, snapshot: Mapping[str, Any] | None = None
    ) -> Review | None:
        row = self._row(op_id)
        if row.op.fence != fence or row.op.status is not Status.UNKNOWN:
            self._moved(row, fence)
        return self._open(row, reason, snapshot)

    def _open(self, row: _Row, reason: str, snapshot: Mapping[str, Any] | None) -> Review | None:
        """A review of `row`'s operation; None when one is open already."""
        if any(r.resolved_at is None for r in row.reviews):
            return None
        review = Review(
            id=next(self._ids),
            op_id=row.op.id,
            reason=reason,
            opened_at=self.clock(),
            snapshot=dict(snapshot or {}),
            resolution=None,
            resolved_by=None,
            resolved_at=None,
            note=None,
        )
        row.reviews.append(review)
        return review

    def mark_notified(self, review_id: int) -> None:
        for row in self._rows.values():
            row.reviews = [
                r.model_copy(update={"notified_at": self.clock()}) if r.id == review_id else r
                for r in row.reviews
            ]


__all__ = ["FakeClock", "MemoryLedger"]
