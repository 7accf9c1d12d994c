"""A worker's steps as functions, one `Worker` per call: for tests, scripts and the
adapter guide, which run a step against a ledger without a worker process.

    steps.dispatch(ledger, registry, op_id, owner="w1", lease=timedelta(seconds=60))
    steps.reconcile(ledger, registry, op_id, owner="w2", lease=timedelta(seconds=60))

The steps themselves are `tasks.worker.Worker`'s methods; a worker process keeps one
`Worker` (`tasks.app.Runtime.worker`) and calls it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta

from opledger.adapters.registry import Registry
from opledger.ledger.decide import ReviewPolicy
from opledger.ledger.facades import WorkerLedger

from .config import DEFAULT_POLICY, DEFAULT_WAIT, FollowUp, FollowUps, WorkerConfig, _nothing
from .held import HOLD_MAX, HOLD_MIN, hold_until
from .hooks import HOOKS, Hooks
from .results import Step, StepResult
from .worker import Worker, snapshot, utcnow


def dispatch(
    ledger: WorkerLedger,
    registry: Registry,
    op_id: str,
    *,
    owner: str,
    lease: timedelta,
    reconcile_now: FollowUp | None = None,
    hooks: Hooks = HOOKS,
    wait: timedelta = DEFAULT_WAIT,
    sleep: Callable[[float], None] = time.sleep,
) -> StepResult:
    """`Worker.dispatch(op_id)` of a worker built for this one call."""
    worker = Worker(
        ledger,
        registry,
        owner=owner,
        config=WorkerConfig(lease=lease, wait=wait),
        sleep=sleep,
        hooks=hooks,
        follow_ups=FollowUps(reconcile=reconcile_now or _nothing),
    )
    return worker.dispatch(op_id)


def reconcile(
    ledger: WorkerLedger,
    registry: Registry,
    op_id: str,
    *,
    owner: str,
    lease: timedelta,
    now: Callable[[], datetime] = utcnow,
    max_lookups: int = 2,
    policy: ReviewPolicy = DEFAULT_POLICY,
    on_review: FollowUp | None = None,
    reconcile_now: FollowUp | None = None,
    hooks: Hooks = HOOKS,
) -> StepResult:
    """`Worker.reconcile(op_id)` of a worker built for this one call."""
    worker = Worker(
        ledger,
        registry,
        owner=owner,
        config=WorkerConfig(lease=lease, policy=policy, max_lookups=max_lookups),
        clock=now,
        hooks=hooks,
        follow_ups=FollowUps(
            reconcile=reconcile_now or _nothing, review_opened=on_review or _nothing
        ),
    )
    return worker.reconcile(op_id)


__all__ = [
    "DEFAULT_POLICY",
    "DEFAULT_WAIT",
    "HOLD_MAX",
    "HOLD_MIN",
    "Step",
    "StepResult",
    "dispatch",
    "hold_until",
    "reconcile",
    "snapshot",
    "utcnow",
]
