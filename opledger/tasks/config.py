"""What a worker reads besides the ledger and the adapters: its settings (`WorkerConfig`,
from the OPLEDGER_ environment), what its steps ask of the queues (`FollowUps`), and how a
process that claims sets its ledger (`claim_as_configured`): a Celery worker, or an agent
dispatching inline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from opledger.ledger.decide import ReviewPolicy

if TYPE_CHECKING:
    from opledger.settings import Settings

#: the review policy when the caller names none (the settings' defaults)
DEFAULT_POLICY = ReviewPolicy()

#: the most a dispatch waits in its task, in all, for room its provider's ledger says comes
#: within that time, by default (OPLEDGER_PROVIDER_WAIT_SECONDS)
DEFAULT_WAIT = timedelta(seconds=2)

#: called with an operation id: reconcile it now (a fenced-out worker's outcome was kept on
#: an unknown operation, or a claim was quarantined), a review was opened, or a
#: notification prepared to be dispatched
FollowUp = Callable[[str], None]


def _nothing(op_id: str) -> None:
    """No follow-up: the sweep or the relay comes back to it."""


@dataclass(frozen=True)
class FollowUps:
    """What a step asks to happen next, outside it (the Celery tasks publish them)."""

    #: reconcile an operation now rather than at its next scheduled check
    reconcile: FollowUp = _nothing
    #: a review was opened by this worker: notify someone (`notify_review`)
    review_opened: FollowUp = _nothing
    #: a notification was prepared: dispatch it
    dispatch: FollowUp = _nothing


@dataclass(frozen=True)
class WorkerConfig:
    """The settings a worker's steps read (`from_settings`: the OPLEDGER_ environment)."""

    lease: timedelta = timedelta(seconds=60)
    policy: ReviewPolicy = field(default_factory=ReviewPolicy)
    #: the most a dispatch waits in its task, in all, for room the ledger says comes
    #: within it; room further off is waited for outside any task (`Worker.dispatch`)
    wait: timedelta = DEFAULT_WAIT
    #: lookups one reconcile makes at most before it looks again later
    max_lookups: int = 2
    #: where review notifications go (None: none are sent)
    review_webhook_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerConfig:
        return cls(
            lease=timedelta(seconds=settings.lease_seconds),
            policy=ReviewPolicy(
                after_attempts=settings.review_after_attempts,
                after=timedelta(seconds=settings.review_after_seconds),
            ),
            wait=timedelta(seconds=settings.provider_wait_seconds),
            review_webhook_url=settings.review_webhook_url or None,
        )


def claim_as_configured(ledger: Any, *, suspect: timedelta, synchronous: bool) -> None:
    """Have `ledger` claim as the deployment says: how long after a ledger switch an
    operation's first dispatch is suspect (`OPLEDGER_SWITCH_SUSPECT_SECONDS`), and whether
    its commits wait for a synchronous standby (strict mode), which tells a switch that lost
    nothing from one that may have. Every process that claims (a worker, an agent sending
    inline) is set so, since whichever sees a switch first records it for all."""
    ledger.suspect_window = suspect
    ledger.claims_synchronous = synchronous
