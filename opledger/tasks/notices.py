"""What a review notification tells its webhook: which review opened, of which operation,
and why. It leaves the ledger for a third party (a chat room, a pager), so nothing in it is
shown that looks like a secret (`opledger.ledger.sensitive`): in a reason that quotes a
provider's error, a card number or an API key is sent as its kind and size, and the rest of
the reason as written."""

from __future__ import annotations

from typing import Any

from opledger.ledger import Operation, Review
from opledger.ledger.sensitive import scrub, scrub_text


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
