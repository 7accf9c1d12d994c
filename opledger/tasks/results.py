"""What a worker's step did with an operation: `Step` and `StepResult`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from opledger.ledger import Answer, Operation
from opledger.ledger.decide import Decision


class Step(StrEnum):
    """What a worker's step did with an operation."""

    NOOP = "noop"  #: nothing to do (redelivered, already claimed, finished)
    DISPATCHED = "dispatched"  #: sent, and the outcome recorded
    CONFIRMED = "confirmed"  #: settled as confirmed on evidence
    REJECTED = "rejected"  #: settled as rejected on evidence
    WAITING = "waiting"  #: a check is scheduled (in flight, pending, search lag)
    REVIEW = "review"  #: a person has it (a review is open)
    FENCED = "fenced"  #: another claim moved it first; this worker's writes were refused
    CANCELLED = "cancelled"  #: its grant was revoked before anything was sent
    #: no adapter of this worker serves its action: nothing sent, no review; tried again
    #: later (by whichever worker takes the check), so a worker that serves it resumes it
    HELD = "held"
    #: its provider had no room (its declared limits, a "not now", an open breaker):
    #: nothing claimed, nothing sent; tried again when the provider should have room
    BUSY = "busy"
    #: the ledger may have forgotten an earlier ask or attempt of it (a switch): nothing
    #: claimed or sent; it is unknown, and its provider's evidence decides (else a person)
    QUARANTINED = "quarantined"


@dataclass(frozen=True)
class StepResult:
    """What a step did, the operation as it ended, and the decision behind it."""

    action: Step
    operation: Operation | None = None
    decision: Decision | None = None
    #: how an agent is answered about the operation, where the step settled it and knows
    #: that without reading it (`claims.settled_answer`): an inline dispatch's answer
    answer: Answer | None = None
