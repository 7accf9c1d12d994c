"""Count what went wrong, from the provider's ground truth and the final ledger.

Nothing here asks a provider anything on opledger's behalf: it only compares what the
sandbox says it received and applied with what the ledger recorded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from opledger.adapters.smtp import message_id_for
from opledger.ledger import History, Ledger, OperationNotFound, Status


def effect_key(history: History) -> str:
    """Where the sandbox counts this operation's effect and requests."""
    op = history.operation
    if op.action.startswith("email.smtp_send"):
        return f"smtp:{message_id_for(op)}"
    if op.action.startswith("email."):
        return f"email:{op.idempotency_key}"
    return f"crm:{op.idempotency_key}"


@dataclass
class Audit:
    ops: int = 0
    confirmed: int = 0
    rejected: int = 0
    cancelled: int = 0
    unknown_in_review: int = 0
    stuck: int = 0
    lost: int = 0
    duplicate_effects: int = 0
    dispatches_while_in_flight: int = 0
    #: for each provider (contract kind): operations, how many went to a person, and why
    reviews_by_provider: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: for each rate-limited account: the calls its front door admitted, and those it
    #: answered "not now" (429: over its concurrency or rate)
    limited: dict[str, dict[str, int]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def count_review(self, history: History, in_review: bool) -> None:
        kind = self.reviews_by_provider.setdefault(
            history.operation.provider, {"ops": 0, "in_review": 0, "share": 0.0, "reasons": {}}
        )
        kind["ops"] += 1
        if in_review:
            kind["in_review"] += 1
            reason = history.reviews[-1].reason
            kind["reasons"][reason] = kind["reasons"].get(reason, 0) + 1
        kind["share"] = round(kind["in_review"] / kind["ops"], 4)

    @property
    def clean(self) -> bool:
        return not (
            self.stuck or self.lost or self.duplicate_effects or self.dispatches_while_in_flight
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def in_flight_races(history: History, requests: list[dict[str, Any]]) -> int:
    """Requests that reached the provider while the attempt that sent the previous request
    could still have been in flight (before that attempt's deadline)."""
    attempts = sorted(history.attempts, key=lambda a: a.started_at)
    arrivals = sorted(float(r["arrived"]) for r in requests)
    races = 0
    for previous, current in itertools.pairwise(arrivals):
        senders = [a for a in attempts if a.started_at.timestamp() <= previous + 0.001]
        if not senders:
            races += 1  # a request no attempt of ours accounts for
            continue
        if current < senders[-1].deadline_at.timestamp():
            races += 1
    return races


def audit(ledger: Ledger, truth: dict[str, Any], op_ids: Iterable[str]) -> Audit:
    """Check every invariant the crash windows must keep, for `op_ids`."""
    result = Audit()
    result.limited = {
        account: {"admitted": seen["admitted"], "over_limit": seen["over_limit"]}
        for account, seen in truth.get("limited", {}).items()
        if seen.get("admitted") or seen.get("over_limit")
    }
    effects: dict[str, int] = truth.get("effects", {})
    requests: dict[str, list[dict[str, Any]]] = truth.get("requests", {})
    for op_id in op_ids:
        result.ops += 1
        try:
            history = ledger.history(op_id)
        except OperationNotFound:
            result.lost += 1
            result.problems.append(f"{op_id}: lost")
            continue
        status = history.operation.status
        key = effect_key(history)
        applied = int(effects.get(key, 0))
        if applied > 1:
            result.duplicate_effects += applied - 1
            result.problems.append(f"{op_id}: applied {applied} times")
        races = in_flight_races(history, requests.get(key, []))
        if races:
            result.dispatches_while_in_flight += races
            result.problems.append(f"{op_id}: {races} requests while an attempt was in flight")
        if status is Status.CONFIRMED:
            result.confirmed += 1
        elif status is Status.REJECTED:
            result.rejected += 1
        elif status is Status.CANCELLED:
            result.cancelled += 1
        elif status is Status.UNKNOWN and history.at_rest:
            result.unknown_in_review += 1
        elif status is Status.PREPARED and not history.attempts:
            result.lost += 1
            result.problems.append(f"{op_id}: never dispatched")
        else:
            result.stuck += 1
            result.problems.append(f"{op_id}: stuck {status}")
        result.count_review(history, status is Status.UNKNOWN and history.at_rest)
        if status is Status.CONFIRMED and applied == 0:
            result.problems.append(f"{op_id}: confirmed but the provider applied nothing")
    return result
