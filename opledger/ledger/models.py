"""The ledger's records: immutable, keyword-only, timezone-aware."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from .window import SendWindow


class Record(BaseModel):
    """Base of every record the ledger hands out: frozen, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Status(StrEnum):
    """Where an operation stands. The database holds the same enum (`op_status`)."""

    PREPARED = "prepared"  #: Recorded before anything crossed the boundary; not yet claimed.
    DISPATCHING = "dispatching"  #: A worker holds a fenced claim and may be calling the provider.
    CONFIRMED = "confirmed"  #: Evidence binding this operation says the effect happened.
    REJECTED = "rejected"  #: The provider definitively refused this request.
    UNKNOWN = "unknown"  #: The effect may or may not have happened; evidence is still needed.
    CANCELLED = "cancelled"  #: Stopped before any effect (revoked authority or an operator).

    @property
    def final(self) -> bool:
        return self in FINAL_STATUSES


FINAL_STATUSES = frozenset({Status.CONFIRMED, Status.REJECTED, Status.CANCELLED})

#: Every status change the ledger allows; the database trigger enforces the same table.
ALLOWED_TRANSITIONS: frozenset[tuple[Status, Status]] = frozenset(
    {
        (Status.PREPARED, Status.DISPATCHING),
        (Status.PREPARED, Status.CANCELLED),
        # quarantined after a ledger switch: an attempt the ledger forgot may have been made
        (Status.PREPARED, Status.UNKNOWN),
        (Status.DISPATCHING, Status.CONFIRMED),
        (Status.DISPATCHING, Status.REJECTED),
        (Status.DISPATCHING, Status.UNKNOWN),
        (Status.UNKNOWN, Status.CONFIRMED),
        (Status.UNKNOWN, Status.REJECTED),
        (Status.UNKNOWN, Status.DISPATCHING),
        (Status.UNKNOWN, Status.CANCELLED),
    }
)


class Operation(Record):
    """One intended external effect, recorded before dispatch."""

    id: str
    tenant: str
    workflow_id: str
    intent_key: str
    action: str
    target: str
    provider: str
    payload_digest: str
    payload_size: int
    authorization_ref: str
    status: Status
    fence: int
    lease_owner: str | None
    lease_expires_at: AwareDatetime | None
    idempotency_key: str
    provider_result_id: str | None
    evidence_checked_at: AwareDatetime | None
    next_check_at: AwareDatetime | None
    #: an operator resolved its review with "retry": the next reconcile sends once more
    operator_retry_by: str | None = None
    #: the trace context of the code that prepared it (a W3C `traceparent`), opaque here:
    #: the workers' spans link back to it; None when tracing was off
    traceparent: str | None = None
    #: how many of the operations it runs after (`after`) are not confirmed yet; it is
    #: claimed only at 0
    waiting_on: int = 0
    #: how wide its act is: `run` (one act of `workflow_id`'s run) or `tenant` (one act of
    #: the tenant whatever run asks; `workflow_id` is the run that asked it first)
    intent_scope: Literal["run", "tenant"] = "run"
    record_version: int
    created_at: AwareDatetime
    updated_at: AwareDatetime

    @property
    def marker(self) -> str:
        """What an adapter marks the effect with, to find it again (a Message-ID, a
        metadata field): the operation's first idempotency key, derived from its intent.
        The same across an operator's new-key retries, and for the act asked again after
        the ledger lost its record (a failover, a restore), whose new operation has another
        id. An operation recorded before keys were derived has its id as its key, and so
        as its marker."""
        return self.idempotency_key.split(".k", 1)[0]


class ClaimTerms(Record):
    """How long a claim holds its operation and how long its attempt may take.

    Built once per worker process (`Registry.claim_terms`); the per-provider entries come
    from the adapters' contracts and win over the defaults. `in_flight` defaults to the
    lease, `send_window` to the ledger's own default.
    """

    lease: timedelta = timedelta(seconds=60)
    in_flight: timedelta | None = None
    send_window: timedelta | None = None
    in_flight_by_provider: dict[str, timedelta] = Field(default_factory=dict)
    send_window_by_provider: dict[str, timedelta] = Field(default_factory=dict)
    #: each limited provider's limits, as `Limits.claim_form` gives them (none: no limit)
    limits_by_provider: dict[str, dict[str, float | int]] = Field(default_factory=dict)

    @property
    def limits_json(self) -> str:
        """`limits_by_provider` as JSON (the claim statement's form)."""
        return json.dumps(self.limits_by_provider, sort_keys=True)

    @property
    def in_flight_json(self) -> str:
        """`in_flight_by_provider` in seconds, as JSON (the claim statement's form)."""
        return _seconds_json(self.in_flight_by_provider)

    @property
    def send_window_json(self) -> str:
        """`send_window_by_provider` in seconds, as JSON (the claim statement's form)."""
        return _seconds_json(self.send_window_by_provider)

    @model_validator(mode="after")
    def _positive(self) -> ClaimTerms:
        durations: dict[str, list[timedelta | None]] = {
            "lease": [self.lease],
            "in_flight": [self.in_flight, *self.in_flight_by_provider.values()],
            "send_window": [self.send_window, *self.send_window_by_provider.values()],
        }
        for name, values in durations.items():
            if any(v is not None and v <= timedelta(0) for v in values):
                raise ValueError(f"{name} must be positive")
        return self


def _seconds_json(durations: dict[str, timedelta]) -> str:
    return json.dumps({name: d.total_seconds() for name, d in sorted(durations.items())})


class Claim(Record):
    """A fenced hold on an operation, returned by `Ledger.claim`.

    Every write made under it is conditional on `fence` and `token`; the attempt row was
    committed before this object was returned, so the provider call may start — but only
    until `send_by`: `window.check()` refuses once the window has passed, measured on this
    process's monotonic clock (see `opledger.ledger.window`). The operation's own facts (its
    id, key, lease) are read from `operation`, as the claim left it, never copied.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    #: the claim's credentials: every write under it is conditional on both
    fence: int
    token: str
    owner: str
    attempt_n: int
    started_at: AwareDatetime
    deadline_at: AwareDatetime
    #: the database's time when the claim committed (None: not issued by a ledger)
    db_now: AwareDatetime | None = None
    #: no request may start under this claim after this instant (database time)
    send_by: AwareDatetime | None = None
    #: the frozen payload, loaded with the claim (the operation carries only its digest)
    payload: dict[str, Any]
    payload_canonical: str
    #: the operation as the claim left it (dispatching, leased to `owner`)
    operation: Operation
    #: the ledger's epoch the claim was issued in (None: not issued by a ledger); an
    #: outcome for a claim of an earlier epoch the ledger no longer knows is kept as an
    #: orphan receipt, never dropped
    epoch: int | None = None
    #: the send-by window on this process's clock; checked right before bytes leave. A
    #: claim built by hand (a contract probe, not issued by a ledger) has none to enforce.
    window: SendWindow = Field(default_factory=SendWindow.unbounded, exclude=True, repr=False)

    @property
    def op_id(self) -> str:
        return self.operation.id

    @property
    def idempotency_key(self) -> str:
        """Our idempotency key for this attempt (what the provider deduplicates on)."""
        return self.operation.idempotency_key

    @property
    def lease_expires_at(self) -> datetime | None:
        return self.operation.lease_expires_at


class Binding(Record):
    """What a piece of evidence ties together. A confirmation must bind this operation."""

    #: the idempotency key the provider saw (ours, if it answers our request)
    idempotency_key: str | None = None
    receipt_id: str | None = None
    target: str | None = None
    payload_digest: str | None = None
    resulting_version: str | None = None


class Confirmed(Record):
    """The provider says the effect happened, and says it about this request."""

    kind: Literal["confirmed"] = "confirmed"
    receipt_id: str
    binding: Binding = Binding()
    accepted_only: bool = False  #: custody (queued, accepted), not final delivery
    #: what the effect produced, for whoever asked for it (the created object's id, its
    #: amount, a case's new version): a small JSON object, kept with the evidence as
    #: `detail["result"]` (at most `evidence.RESULT_LIMIT` bytes canonical, else replaced
    #: by a note saying why) and returned by `effect()` and the agents' tools as `data`
    result: dict[str, Any] | None = None
    detail: dict[str, Any] = Field(default_factory=dict)


class Rejected(Record):
    """The provider definitively refused this request; it will not take effect."""

    kind: Literal["rejected"] = "rejected"
    code: str
    reason: str
    #: the refusal says the target is already in the state we asked for ("already closed",
    #: "already exists"): after an earlier attempt that may have applied, our own attempt
    #: may have caused it, so it is then no rejection of this request (rule 11)
    conflicting_state: bool = False
    detail: dict[str, Any] = Field(default_factory=dict)


class Ambiguous(Record):
    """The effect may or may not have happened (timeout, reset, unexplained 5xx, in flight)."""

    kind: Literal["ambiguous"] = "ambiguous"
    code: str
    reason: str
    replayed: bool = False  #: the provider replayed a stored response for this key
    detail: dict[str, Any] = Field(default_factory=dict)


Outcome = Annotated[Confirmed | Rejected | Ambiguous, Field(discriminator="kind")]


class Attempt(Record):
    """One crossing of the boundary, written before the provider call."""

    op_id: str
    n: int
    fence: int
    owner: str
    idempotency_key: str
    started_at: AwareDatetime
    deadline_at: AwareDatetime
    finished_at: AwareDatetime | None
    outcome: Literal["confirmed", "rejected", "ambiguous"] | None
    response: dict[str, Any] | None
    authorized_by: str | None
    #: the claim's send-by instant (None for attempts recorded before it existed)
    send_by: AwareDatetime | None = None


class EvidenceSource(StrEnum):
    """Where a piece of evidence came from."""

    DISPATCH = "dispatch"  #: the provider's answer to one of our attempts
    LOOKUP = "lookup"  #: an adapter's lookup (status API, key replay, search)
    OPERATOR = "operator"  #: a person's resolution of a review


class Verdict(StrEnum):
    """What a piece of evidence says about the operation."""

    CONFIRMED = "confirmed"  #: it happened
    REJECTED = "rejected"  #: the provider definitively refused it
    AMBIGUOUS = "ambiguous"  #: an attempt's outcome that may or may not have applied
    ABSENT = "absent"  #: an authoritative status API says it never saw the request
    PENDING = "pending"  #: the provider says the request is still executing
    INCONCLUSIVE = "inconclusive"  #: nothing that binds this operation either way


class Evidence(Record):
    """A fact learned about an operation. Kept even when it could not move the status."""

    id: int
    op_id: str
    attempt_n: int | None
    fence: int | None
    source: EvidenceSource
    verdict: Verdict
    binding: Binding
    detail: dict[str, Any]
    applied: bool
    recorded_at: AwareDatetime


class Transition(Record):
    """An audited status change."""

    id: int
    op_id: str
    from_status: Status | None
    to_status: Status
    fence: int
    actor: str
    reason: str
    at: AwareDatetime


class Review(Record):
    """A request for a person to decide what no evidence could."""

    id: int
    op_id: str
    reason: str
    opened_at: AwareDatetime
    snapshot: dict[str, Any]
    resolution: str | None
    resolved_by: str | None
    resolved_at: AwareDatetime | None
    note: str | None
    notified_at: AwareDatetime | None = None


class Dependency(Record):
    """An operation another one runs after (`prepare(after=...)`), as it stands now.

    The dependent is claimed only once every dependency is confirmed; a rejected or
    cancelled one cancels it; while one is unknown it waits, and `review_id` /
    `review_reason` say which person holds that dependency and why."""

    op_id: str
    action: str
    target: str
    status: Status
    #: why its status last changed (the provider's code, an operator's reason...)
    reason: str | None
    review_id: int | None
    review_reason: str | None

    @property
    def blocking(self) -> bool:
        """Whether the dependent still waits on it."""
        return self.status is not Status.CONFIRMED


class Authorization(Record):
    """A grant under which a tenant's operations may write to providers."""

    ref: str
    tenant: str
    scope: tuple[str, ...]  #: action patterns, e.g. ``crm.*`` or ``email.send.v1``
    granted_by: str
    granted_at: AwareDatetime
    expires_at: AwareDatetime | None
    revoked_at: AwareDatetime | None
    revoked_by: str | None
    revoke_reason: str | None

    def active_at(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class History(Record):
    """Everything the ledger knows about one operation, oldest first."""

    operation: Operation
    attempts: tuple[Attempt, ...]
    evidence: tuple[Evidence, ...]
    transitions: tuple[Transition, ...]
    reviews: tuple[Review, ...]

    @property
    def open_review(self) -> Review | None:
        """The review a person holds it with, if one is open (at most one is: the
        database allows one open review per operation)."""
        return next((r for r in reversed(self.reviews) if r.resolved_at is None), None)

    @property
    def at_rest(self) -> bool:
        """Nothing automatic will move it any more: final, or unknown with a person
        holding it (an open review)."""
        status = self.operation.status
        return status.final or (status is Status.UNKNOWN and self.open_review is not None)


class PendingApproval(Record):
    """The approval an operation waits for before any claim (`opledger.ledger.approvals`),
    as an agent is told: since when, until when, how many people must say yes and who
    did, and why the action's policy asks."""

    requested_at: AwareDatetime
    expires_at: AwareDatetime
    approvers_required: int
    approved_by: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()


class Answer(Record):
    """How one operation stands, as an agent waiting on it is answered (`Ledger.answers`):
    the operation and what an answer says beside its status, read in one statement."""

    operation: Operation
    #: why its status last changed (its newest transition's reason), if it ever changed
    last_reason: str | None
    #: the detail of the applied evidence that settled it (confirmed or rejected; empty
    #: otherwise), its provider's result document opened when it was sealed
    settled_detail: dict[str, Any]
    #: while it is unknown, the review a person holds it with, if one is open
    open_review: Review | None
    #: while it waits on dependencies (prepared), those not confirmed yet, as they stand
    blocked_by: tuple[Dependency, ...]
    #: while it is unknown although no attempt may have reached the provider (each one sent
    #: nothing): why the newest sent nothing (`no_adapter`, `no_connection`, ...); else None
    unsent_why: str | None = None
    #: while it is held for a person's approval (prepared), the pending request
    awaiting_approval: PendingApproval | None = None


class Ask(Record):
    """One ask of an intent (`Ledger.ask`): who asked, and what it asked differently.

    `asked_by` is the asker's own id for the call (a model's tool-call id, an MCP request
    id): evidence of which call asked, never part of the intent. `differs` names what this
    ask asked otherwise than the recorded operation (`action`, `target`, `payload_digest`,
    `authorization_ref`, `after`); none of it was sent. The ask that recorded the operation
    differs in nothing."""

    id: int
    op_id: str
    asked_at: AwareDatetime
    asked_by: str | None
    actor: str
    payload_digest: str
    authorization_ref: str
    differs: tuple[str, ...]


class Asked(Record):
    """What `Ledger.ask` found: the operation of the intent, whether this ask recorded it,
    and what it asked differently from the recorded one (nothing of that was recorded or
    will be sent)."""

    operation: Operation
    #: this ask recorded the operation; False when the intent was recorded already
    first: bool
    #: the recorded operation's parts this ask asked otherwise ("action", "target",
    #: "payload_digest", "authorization_ref", "after"); empty when it asked the same
    differs: tuple[str, ...] = ()
