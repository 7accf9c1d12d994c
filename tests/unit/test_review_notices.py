"""A review notification's body leaves for a third party: nothing in it looks like a secret."""

from __future__ import annotations

from opledger.ledger import Review
from opledger.tasks.notices import review_opened

from .histories import OP_ID, T0, operation


def _review(reason: str) -> Review:
    return Review(
        id=7,
        op_id=OP_ID,
        reason=reason,
        opened_at=T0,
        snapshot={},
        resolution=None,
        resolved_by=None,
        resolved_at=None,
        note=None,
    )


def test_the_body_names_the_review_and_hides_a_reason_quoting_a_secret() -> None:
    plain = review_opened(operation(), _review("3 attempts left it unknown"))
    assert plain == {
        "event": "review.opened",
        "review_id": 7,
        "op_id": OP_ID,
        "tenant": "acme",
        "action": "crm.close_case.v1",
        "target": "case-318",
        "reason": "3 attempts left it unknown",
        "opened_at": T0.isoformat(),
    }
    quoted = "card_declined: card 4242 4242 4242 4242 refused for key sk_live_4eC39HqLyjWDarjt"
    body = review_opened(operation(target="sk_test_4eC39HqLyjWDarjtT1"), _review(quoted))
    # the reason keeps its words; what it quotes of a secret is its kind and size
    assert body["reason"] == (
        "card_declined: card [hidden card number: text, 19 characters] refused for key "
        "[hidden API key: text, 24 characters]"
    )
    assert body["target"] == "[hidden API key: text, 26 characters]"
    assert body["op_id"] == OP_ID and body["review_id"] == 7
