"""What an attempt's outcome becomes before the worker saves it, besides `admit`: an
attempt that provably sent nothing (`not_sent`), and a fresh success that may repeat an
earlier attempt (`flag_duplicate`), saved with the review that asks a person to check;
and the same review when a reconcile confirms on such a success kept as evidence
(`duplicate_settled`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from opledger.adapters.base import Adapter
from opledger.ledger import Ambiguous, Attempt, Claim, Evidence, History, Outcome
from opledger.ledger.evidence import NOT_SENT, POSSIBLE_DUPLICATE, fresh_resend, possible_duplicate
from opledger.ledger.facades import WorkerLedger
from opledger.ledger.models import Verdict

from .snapshots import snapshot

log = logging.getLogger("opledger.worker")


def not_sent(claim: Claim) -> Ambiguous:
    """The outcome of an attempt whose send-by window had passed: nothing was sent."""
    log.warning("%s: send-by window passed (send by %s); nothing sent", claim.op_id, claim.send_by)
    return Ambiguous(
        code=NOT_SENT,
        reason="not sent: the send-by window had passed",
        detail={
            "why": "window_passed",
            "send_by": claim.send_by.isoformat() if claim.send_by else None,
            "late_s": round(-claim.window.remaining(), 3),
        },
    )


def flag_duplicate(
    ledger: WorkerLedger,
    adapter: Adapter,
    claim: Claim,
    outcome: Outcome,
    history: History | None,
    now: datetime,
) -> tuple[Outcome, dict[str, Any] | None]:
    """`outcome` (admitted), and the snapshot of a review to open with it when it is a
    fresh success that may repeat an earlier attempt (`evidence.possible_duplicate`); else
    None. The outcome is then marked (`possible_duplicate` in its detail: the evidence
    says so wherever it is read, an agent's answer included).

    Only a resend to a provider that marks replays can be one (`fresh_resend`): the history
    is read (when the caller has none) on that path alone, never on a first attempt."""
    contract = adapter.contract
    if not fresh_resend(contract, claim, outcome):
        return outcome, None
    if history is None:
        history = ledger.history(claim.op_id)
    earlier = possible_duplicate(contract, claim, outcome, history.attempts, history.evidence)
    if not earlier:
        return outcome, None
    flag = {"attempts": [a.n for a in earlier], "key": claim.idempotency_key}
    marked = outcome.model_copy(update={"detail": {**outcome.detail, POSSIBLE_DUPLICATE: flag}})
    reason = _reason(adapter, claim.attempt_n, [a.n for a in earlier])
    log.error(
        "%s: %s",
        claim.op_id,
        reason,
        extra={"op_id": claim.op_id, "attempt": claim.attempt_n, "fence": claim.fence},
    )
    return marked, {
        **snapshot(history, adapter, reason, now),
        "kind": POSSIBLE_DUPLICATE,
        "fresh_success": {
            "attempt": claim.attempt_n,
            "idempotency_key": claim.idempotency_key,
            "started_at": claim.started_at.isoformat(),
            "outcome": marked.model_dump(mode="json"),
        },
        "earlier_attempts": [_earlier(a, history) for a in earlier],
        "what_it_could_mean": _meaning(adapter),
    }


def duplicate_settled(
    adapter: Adapter, history: History, evidence: Evidence, now: datetime
) -> dict[str, Any] | None:
    """The snapshot of the review to open when a reconcile confirms on `evidence` marked
    as a possible duplicate (`flag_duplicate`'s mark, kept on a fenced-out worker's fresh
    success); None for any other evidence. Built like the outcome path's: same reason form,
    the success's attempt, the earlier attempts it may have repeated."""
    mark = evidence.detail.get(POSSIBLE_DUPLICATE)
    if evidence.verdict is not Verdict.CONFIRMED or not isinstance(mark, dict):
        return None
    ns = [int(n) for n in mark.get("attempts") or []]
    n = evidence.attempt_n or 0
    reason = _reason(adapter, n, ns)
    log.error("%s: %s (settled on evidence %s)", evidence.op_id, reason, evidence.id)
    own = next((a for a in history.attempts if a.n == n), None)
    return {
        **snapshot(history, adapter, reason, now),
        "kind": POSSIBLE_DUPLICATE,
        "fresh_success": {
            "attempt": n,
            "idempotency_key": mark.get("key"),
            "started_at": own.started_at.isoformat() if own else None,
            "outcome": own.response if own and own.response else evidence.detail,
            "evidence_id": evidence.id,
        },
        "earlier_attempts": [_earlier(a, history) for a in history.attempts if a.n in ns],
        "what_it_could_mean": _meaning(adapter),
    }


def _reason(adapter: Adapter, attempt_n: int, earlier: Sequence[int]) -> str:
    contract = adapter.contract
    which = ", ".join(str(n) for n in earlier)
    many = "s" if len(earlier) > 1 else ""
    return (
        f"{POSSIBLE_DUPLICATE}: attempt {attempt_n} was answered with a fresh success, "
        f"not a replay, under the key of attempt{many} {which}, which may have applied it: "
        f"{contract.provider} may have applied the {contract.effect} twice; check for a "
        f"second {contract.effect} and undo the extra one"
    )


def _meaning(adapter: Adapter) -> str:
    contract = adapter.contract
    effect = contract.effect
    return (
        f"{contract.provider} marks every answer it replays from what it stored under a key, "
        f"and this success was not marked: it ran the request afresh, so it no longer knew "
        f"our key (a restart that lost its key store, a key pruned early). The earlier "
        f"attempt's request may have reached it and applied the {effect} before that. The "
        f"operation is confirmed on this receipt. Look for a second {effect} (the earlier "
        f"attempts' evidence, the provider's own records of the target); if there is one, "
        f"undo it as an act of its own (opledger never compensates by itself), then resolve "
        f"this review as acknowledged with what you found."
    )


def _earlier(attempt: Attempt, history: History) -> dict[str, Any]:
    """One earlier attempt and the evidence it left (its dispatch answer, if any)."""
    return {
        **attempt.model_dump(mode="json"),
        "evidence": [
            e.model_dump(mode="json") for e in history.evidence if e.attempt_n == attempt.n
        ],
    }
