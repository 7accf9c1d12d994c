"""A review's notification: an operation of its own, prepared once per review and sent by
the webhook adapter (`notify_review`); and what it tells the webhook: which review opened,
of which operation, and why (`review_opened`). It leaves the ledger for a third party (a
chat room, a pager), so nothing in it is shown that looks like a secret
(`opledger.ledger.sensitive`): in a reason that quotes a provider's error, a card number or
an API key is sent as its kind and size, and the rest of the reason as written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opledger.ledger import Operation, Review
from opledger.ledger.facades import WorkerLedger
from opledger.ledger.sensitive import scrub, scrub_text

#: the action a review's notification is sent with
NOTIFY_ACTION = "webhook.post.v1"


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
    grant = ledger.grant(
        tenant=op.tenant,
        scope=["webhook.*"],
        granted_by="opledger",
        ref=f"opledger-notify-{op.tenant}",
    )
    note = ledger.prepare(
        tenant=op.tenant,
        workflow_id=f"review:{op.id}",
        intent_key=f"review-opened:{review.id}",
        action=NOTIFY_ACTION,
        target="review-webhook",
        payload=review_opened(op, review),  # what a third party may read: no secret
        authorization_ref=grant.ref,
        actor="notify_review",
        traceparent=traceparent,
    )
    ledger.mark_notified(review.id)
    dispatch(note.id)
    return "prepared"


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
