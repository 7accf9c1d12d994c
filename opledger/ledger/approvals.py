"""Approvals: a person approves the exact effect, once, before anything is sent.

An act whose action's approval policy requires it (`approval_policy`) is recorded and
frozen like any other, plus an approval request in the same transaction, bound to the
operation, the frozen payload's digest and its grant; the operation waits (`waiting_on`
+ 1): no claim, no fence, no worker, nothing published. `approve` and `deny` are each one
conditional statement (`queries.approvals`): only a pending approval whose operation still
has the digest the approver was shown and an active grant, by an enabled operator acting
for its tenant whose `approves` patterns cover its action, never the act's own asker; the
last approval needed (1 or 2 distinct people) releases the hold in the same statement. A
denial cancels the operation with its reason; an approval not given in time expires
(`Maintenance.expire_approvals`, run by the sweep) and cancels it too. The claim takes an operation
with an approval only when it is approved for exactly its digest and grant, and the first
claim consumes it (`queries.approvals.approval_cleared`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NoReturn

from pydantic import AwareDatetime

from . import queries as q
from . import store
from .approval_policy import Requirement
from .base import LedgerBase
from .errors import (
    ApprovalAlreadyDecided,
    ApprovalAlreadyGiven,
    ApprovalNotFound,
    AuthorizationRevoked,
    InvalidInput,
    NotAnApprover,
    StaleApproval,
)
from .ids import check_identifier, check_key, check_operation_id, check_operator, check_text
from .models import Record
from .sensitive import scrub

ApprovalStatus = Literal["pending", "approved", "denied", "expired"]
STATUSES: tuple[str, ...] = ("pending", "approved", "denied", "expired")


class Approval(Record):
    """An approval request, bound to its operation's digest and grant, and how it stands."""

    op_id: str
    tenant: str
    action: str
    target: str
    payload_digest: str
    authorization_ref: str
    #: the actor that recorded the act, and the asker it named: neither may approve it
    requested_by: str
    asked_by: str | None = None
    #: why the policy asks (each holding rule, one line)
    reasons: tuple[str, ...] = ()
    approvers_required: int
    #: who approved so far (distinct people)
    approved_by: tuple[str, ...] = ()
    status: ApprovalStatus
    requested_at: AwareDatetime
    expires_at: AwareDatetime
    decided_at: AwareDatetime | None = None
    decided_by: str | None = None
    #: the first claim, which consumed it (once)
    consumed_at: AwareDatetime | None = None
    consumed_fence: int | None = None
    #: the operation's status, and why it last changed (a denial's reason, an expiry's)
    operation_status: str | None = None
    operation_reason: str | None = None
    #: `approve`'s answer only: whether this approval released the operation (the last
    #: one needed)
    released: bool | None = None

    @property
    def approvals_missing(self) -> int:
        return max(0, self.approvers_required - len(self.approved_by))


class ApprovalDecision(Record):
    """One decision, audited: who, when, what they were shown (the digest, the payload with
    its secrets hidden), and their note."""

    id: int
    op_id: str
    tenant: str
    operator: str
    decision: Literal["approved", "denied"]
    payload_digest: str
    authorization_ref: str
    shown: Any
    note: str | None = None
    at: AwareDatetime


#: the longest approval scope pattern
APPROVES_PATTERN_MAX = 120


def check_approves(patterns: Any) -> tuple[str, ...]:
    """An operator's approval scope: action patterns as a grant's scope spells them
    (`stripe.*`, `crm.close_case.v1`; `*` any run of characters), sorted, each once; empty:
    approves nothing."""
    if isinstance(patterns, str):
        raise InvalidInput(
            "approves is a list of action patterns, not one string", field="approves"
        )
    checked = set()
    for pattern in patterns:
        check_identifier("approves", pattern, max_length=APPROVES_PATTERN_MAX)
        if not all(ch.isalnum() or ch in "._*" for ch in pattern):
            raise InvalidInput(
                f"approval pattern {pattern!r} has characters other than a-z0-9._*",
                field="approves",
            )
        checked.add(pattern)
    return tuple(sorted(checked))


def _approval(row: Any) -> Approval:
    return Approval.model_validate(dict(row._mapping))


class Approvals(LedgerBase):
    """The approval requests of acts whose policy requires a person: list, show, approve,
    deny, their audit trail and their expiry."""

    def approval_params(
        self, op_id: str, requirement: Requirement, *, requested_by: str, asked_by: str | None
    ) -> dict[str, Any]:
        """The parameters of `queries.INSERT_APPROVAL` for the new operation `op_id`."""
        return {
            "op_id": op_id,
            "requested_by": requested_by,
            "asked_by": asked_by,
            "reasons": list(requirement.reasons),
            "approvers": requirement.approvers,
            "expires_after": requirement.expires_after,
        }

    def approvals(
        self, *, tenant: str | None = None, status: str | None = "pending", limit: int = 50
    ) -> tuple[Approval, ...]:
        """Approval requests, oldest first: of `tenant` (None: every tenant's), with
        `status` (None: any; `pending` ones only while their operation waits)."""
        if tenant is not None:
            tenant = check_key("tenant", tenant)
        if status is not None and status not in STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(STATUSES)}", field="status")
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_APPROVALS,
                {"tenant": tenant, "status": status, "limit": max(1, min(limit, 10_000))},
            )
            return tuple(_approval(r) for r in rows)

    def approval(self, op_id: str) -> Approval:
        """The approval request of `op_id`; `ApprovalNotFound` when it has none."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(q.SELECT_APPROVAL, {"op_id": op_id}).one_or_none()
        if row is None:
            raise ApprovalNotFound(f"no approval is asked for {op_id}", op_id=op_id)
        return _approval(row)

    def approval_decisions(self, op_id: str) -> tuple[ApprovalDecision, ...]:
        """Every decision on `op_id`'s approval, oldest first."""
        check_operation_id(op_id)
        with self._single() as conn:
            rows = conn.execute(q.SELECT_APPROVAL_DECISIONS, {"op_id": op_id}).all()
        return tuple(store.record(ApprovalDecision, r) for r in rows)

    def approve(
        self,
        op_id: str,
        *,
        operator: str,
        digest: str,
        note: str | None = None,
        shown: Any = None,
    ) -> Approval:
        """Approve `op_id`'s act as `operator`, who was shown the frozen payload whose
        digest is `digest` (and `shown`: the payload as shown, secrets hidden; by default
        the frozen payload with its secrets hidden), in one statement. The last approval
        needed releases the operation (it is claimed and sent as any other); before that,
        the approval stays pending with this one counted. Refused, changing nothing:
        `ApprovalNotFound`, `ApprovalAlreadyDecided` (decided, expired, or the operation no
        longer waits), `StaleApproval` (another digest), `AuthorizationRevoked` (the grant
        is no longer active), `NotAnApprover`, `ApprovalAlreadyGiven`."""
        params = self._decision_params(op_id, operator, digest, note, shown)
        with self._single() as conn:
            row = conn.execute(q.APPROVE, params).one_or_none()
        if row is None:
            self._refuse(op_id, params, approving=True)
        return _approval(row)

    def deny(
        self, op_id: str, *, operator: str, digest: str, note: str, shown: Any = None
    ) -> Approval:
        """Deny `op_id`'s act as `operator` (shown `digest`), with a `note` saying why: the
        approval is denied and the operation cancelled ("denied by <operator>: <note>"),
        what runs after it too, in one statement. Refused as `approve` is (a revoked grant
        does not stop a denial)."""
        if not isinstance(note, str) or not note.strip():
            raise InvalidInput("a denial says why (note)", field="note")
        params = self._decision_params(op_id, operator, digest, note, shown)
        params["reason"] = f"denied by {params['operator']}: {params['note'].strip()}"[:2000]
        with self._single() as conn:
            row = conn.execute(q.DENY, params).one_or_none()
        if row is None:
            self._refuse(op_id, params, approving=False)
        return _approval(row)

    # -- helpers ---------------------------------------------------------------------------

    def _decision_params(
        self, op_id: str, operator: str, digest: str, note: str | None, shown: Any
    ) -> dict[str, Any]:
        check_operation_id(op_id)
        operator = check_operator("operator", operator)
        check_identifier("digest", digest, max_length=200)
        if note is not None:  # a person's words: line breaks kept, CRLF as LF
            note = check_text("note", note, max_length=2000)
        if shown is None:
            shown = self.payload(op_id)
        # the record keeps what was shown, its secrets hidden whatever the caller did
        return {
            "op_id": op_id,
            "operator": operator,
            "digest": digest.strip().lower(),
            "note": note,
            "shown": store.to_json(scrub(shown)),
        }

    def _refuse(self, op_id: str, params: Mapping[str, Any], *, approving: bool) -> NoReturn:
        """Why an approval (or a denial) changed nothing, raised."""
        operator = params["operator"]
        with self._single() as conn:
            state = conn.execute(
                q.APPROVAL_REFUSAL, {"op_id": op_id, "operator": operator}
            ).one_or_none()
        if state is None:
            self.get(op_id)  # OperationNotFound for no operation at all
            raise ApprovalNotFound(f"no approval is asked for {op_id}", op_id=op_id)
        if state.status != "pending" or state.operation_status != "prepared":
            raise ApprovalAlreadyDecided(
                f"the approval of {op_id} is {state.status} (the operation is "
                f"{state.operation_status})",
                op_id=op_id,
                status=state.status,
            )
        if approving and state.expired:
            raise ApprovalAlreadyDecided(
                f"the approval of {op_id} expired at {state.expires_at.isoformat()}",
                op_id=op_id,
                status="expired",
            )
        if (
            params["digest"] != state.payload_digest
            or state.operation_digest != state.payload_digest
        ):
            raise StaleApproval(
                f"{op_id}'s frozen payload has digest {state.payload_digest}, not the "
                f"{params['digest']} you were shown: look at it again",
                op_id=op_id,
                digest=state.payload_digest,
            )
        if approving and not state.grant_active:
            raise AuthorizationRevoked(
                f"authorization {state.authorization_ref!r} of {op_id} is no longer active: "
                "nothing may be sent under it, so nothing is approved",
                op_id=op_id,
                ref=state.authorization_ref,
            )
        _check_approver(op_id, operator, state, approving=approving)
        raise ApprovalAlreadyDecided(  # it moved while we looked
            f"the approval of {op_id} changed meanwhile: look at it again", op_id=op_id
        )


def _check_approver(op_id: str, operator: str, state: Any, *, approving: bool) -> None:
    """Raise why `operator` may not decide: not an approver, the asker, or approved already."""
    if not state.operator_known:
        raise NotAnApprover(
            f"{operator!r} is not an operator (agents never approve): add one with "
            "`opledger operator add`",
            op_id=op_id,
            operator=operator,
        )
    if not state.may_approve:
        raise NotAnApprover(
            f"{operator} may not approve {state.action} for tenant {state.tenant!r}: the "
            "account is disabled, does not act for the tenant, or its approval scope "
            "(`opledger operator update --approves`) does not cover the action",
            op_id=op_id,
            operator=operator,
        )
    if approving and not state.not_the_asker:
        raise NotAnApprover(
            f"{operator} asked for {op_id}: the asker never approves their own act",
            op_id=op_id,
            operator=operator,
        )
    if approving and state.approved_already:
        missing = state.approvers_required - len(state.approved_by)
        raise ApprovalAlreadyGiven(
            f"{operator} approved {op_id} already; {missing} more approval(s) by someone "
            "else needed",
            op_id=op_id,
            operator=operator,
        )


__all__ = ["Approval", "ApprovalDecision", "Approvals", "check_approves"]
