"""Notifications: each an operation of its own, prepared once and sent by the webhook
adapter. A review's (`notify_review`): which review opened, of which operation, and why
(`review_opened`). An approval request's (`notify_approval`): which act waits for a person,
why the policy asks, until when, and where an operator approves it (`approval_requested`).
A notification leaves the ledger for a third party (a chat room, a pager), so nothing in it
is shown that looks like a secret (`opledger.ledger.sensitive`): in a reason that quotes a
provider's error, a card number or an API key is sent as its kind and size, and the rest of
the reason as written. A notification never carries a decision back: an approval is given
by a signed-in operator (the console, `opledger approvals approve`), never by a webhook."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import quote

from opledger.ledger import Approval, ApprovalNotFound, Operation, Review
from opledger.ledger.facades import WorkerLedger
from opledger.ledger.sensitive import scrub, scrub_text

#: the action a notification is sent with
NOTIFY_ACTION = "webhook.post.v1"


class ApprovalNotices(WorkerLedger, Protocol):
    """What `notify_approval` asks of the ledger beyond a worker's needs."""

    def approval(self, op_id: str) -> Approval: ...

    def mark_approval_notified(self, op_id: str) -> None: ...


def notify_review(
    ledger: WorkerLedger,
    op_id: str,
    *,
    webhook_url: str | None,
    dispatch: Callable[[str], None],
    traceparent: str | None = None,
) -> str:
    """Prepare the notification of `op_id`'s open review and hand it to `dispatch`.

    The notification is an operation of its own, one per review (its intent key is the
    review id), so a crash or a redelivery here can never send it twice. "noop": no review
    is open; "skipped": no webhook is configured, or the operation is a notification itself
    (the review is marked notified); "prepared"."""
    history = ledger.history(op_id)
    review = history.open_review
    if review is None:
        return "noop"
    op = history.operation
    if not webhook_url or op.action.startswith("webhook."):
        ledger.mark_notified(review.id)  # nothing to send (or a notification's own review)
        return "skipped"
    note = _prepare_notice(
        ledger,
        op.tenant,
        workflow_id=f"review:{op.id}",
        intent_key=f"review-opened:{review.id}",
        target="review-webhook",
        payload=review_opened(op, review),  # what a third party may read: no secret
        actor="notify_review",
        traceparent=traceparent,
    )
    ledger.mark_notified(review.id)
    dispatch(note.id)
    return "prepared"


def notify_approval(
    ledger: ApprovalNotices,
    op_id: str,
    *,
    webhook_url: str | None,
    dispatch: Callable[[str], None],
    traceparent: str | None = None,
) -> str:
    """Prepare the `approval.requested` notification of `op_id`'s approval request and hand
    it to `dispatch`.

    The notification is an operation of its own, one per request (its intent key is the
    operation id: an operation has one approval request), so a crash or a redelivery here
    can never send it twice. "noop": no request waits (none was asked; or it was decided,
    expired, or its operation cancelled meanwhile: marked, nothing to tell); "skipped": no
    webhook is configured, or the act is a notification itself (marked); "prepared"."""
    try:
        approval = ledger.approval(op_id)
    except ApprovalNotFound:
        return "noop"
    if not _waiting(approval):
        ledger.mark_approval_notified(op_id)
        return "noop"
    if not webhook_url or approval.action.startswith("webhook."):
        ledger.mark_approval_notified(op_id)  # nothing to send (or a notification's own)
        return "skipped"
    note = _prepare_notice(
        ledger,
        approval.tenant,
        workflow_id=f"approval:{op_id}",
        intent_key=f"approval-requested:{op_id}",
        target="approval-webhook",
        payload=approval_requested(approval),  # what a third party may read: no secret
        actor="notify_approval",
        traceparent=traceparent,
    )
    ledger.mark_approval_notified(op_id)
    dispatch(note.id)
    return "prepared"


def _waiting(approval: Approval) -> bool:
    """Whether the request still waits for a person: pending, in time, its act held."""
    return (
        approval.status == "pending"
        and approval.operation_status == "prepared"
        and approval.expires_at > datetime.now(UTC)
    )


def _prepare_notice(
    ledger: WorkerLedger,
    tenant: str,
    *,
    workflow_id: str,
    intent_key: str,
    target: str,
    payload: Mapping[str, Any],
    actor: str,
    traceparent: str | None,
) -> Operation:
    """The notification's operation, prepared (or found: the same intent) under the
    tenant's notification grant."""
    grant = ledger.grant(
        tenant=tenant,
        scope=["webhook.*"],
        granted_by="opledger",
        ref=f"opledger-notify-{tenant}",
    )
    return ledger.prepare(
        tenant=tenant,
        workflow_id=workflow_id,
        intent_key=intent_key,
        action=NOTIFY_ACTION,
        target=target,
        payload=payload,
        authorization_ref=grant.ref,
        actor=actor,
        traceparent=traceparent,
    )


def review_opened(op: Operation, review: Review) -> dict[str, Any]:
    """The body of the `review.opened` notification of `op`'s `review`, secrets hidden."""
    body: dict[str, Any] = scrub(
        {
            "event": "review.opened",
            "review_id": review.id,
            "op_id": op.id,
            "tenant": op.tenant,
            "action": op.action,
            "target": op.target,
            "reason": scrub_text(review.reason),
            "opened_at": review.opened_at.isoformat(),
        }
    )
    return body


def approval_path(tenant: str, op_id: str) -> str:
    """The console's page of `op_id`'s approval (a path: the receiver knows its console)."""
    return f"/t/{quote(tenant, safe='')}/ops/{op_id}/approval"


def approval_requested(approval: Approval) -> dict[str, Any]:
    """The body of the `approval.requested` notification of `approval`, secrets hidden.

    Only what the request was written with, never what changes after (who approved so far):
    a redelivery prepares the very same body, so the same notification. Not the payload:
    its digest binds what is approved, and an operator sees the payload itself, with the
    console's redaction, where they approve it."""
    body: dict[str, Any] = scrub(
        {
            "event": "approval.requested",
            "op_id": approval.op_id,
            "tenant": approval.tenant,
            "action": approval.action,
            "target": approval.target,
            "reasons": [scrub_text(r) for r in approval.reasons],
            "approvers_required": approval.approvers_required,
            "requested_by": approval.requested_by,
            "requested_at": approval.requested_at.isoformat(),
            "expires_at": approval.expires_at.isoformat(),
            "payload_digest": approval.payload_digest,
            "console_path": approval_path(approval.tenant, approval.op_id),
        }
    )
    return body
