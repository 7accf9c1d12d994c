"""What a review opens with (`snapshot`): the worker's record of why a person is asked."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from opledger.adapters.base import Adapter, extra
from opledger.ledger import History
from opledger.ledger.consequences import consequences


def snapshot(history: History, adapter: Adapter, reason: str, now: datetime) -> dict[str, Any]:
    """What the review opens with: the attempts, the evidence, the contract, and what each
    resolution could cause."""
    effects = consequences(
        adapter.contract, history.operation, history.attempts, now, history.evidence
    )
    hint = extra(adapter, "search_hint")
    return {
        "reason": reason,
        "search_hint": hint(history.operation) if callable(hint) else None,
        "contract": adapter.contract.model_dump(mode="json"),
        "attempts": [a.model_dump(mode="json") for a in history.attempts],
        "evidence": [e.model_dump(mode="json") for e in history.evidence],
        "consequences": effects.model_dump(mode="json"),
    }
