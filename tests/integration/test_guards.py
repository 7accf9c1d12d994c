"""Every guard beside a fence check, probed through the public API, and proved necessary.

Each status change is one conditional UPDATE (`opledger.ledger.queries`). A fence check
alone is not enough: the fence moves on a claim, a lease expiry, a settlement and an
authorized retry, but not on a worker's outcome, so the fence a caller read can still
match after the operation moved on (a live claim keeps its fence while dispatching; a
worker's outcome settles the operation at the claim's fence).

A probe sets up such a situation, makes the one public call under test, and checks that
the call is refused with the right error and that nothing changed. A broken invariant
raises `Violation`; a broken set-up raises a plain `AssertionError`. Every operation a
probe prepares has a workflow and a grant of its own, so probes run on the session's
database without truncating it between them.

The second half removes guards (the statement rebuilt without the guard's text and
monkeypatched into `opledger.ledger.queries`, the transition trigger disabled, or the
status check in `Reviews.resolve` blinded) and checks that the probe then detects the
violation. Where conditions protect the same property on purpose, each is removed in
turn: the probe holds while any one of them is left, and detects the violation only once
all of them are gone. A guard whose text is not found exactly once fails loudly: if the
SQL was rewritten, update the guard text here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

import pytest
from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.types import NullType

from opledger.ledger import (
    Ambiguous,
    AuthorizationRevoked,
    Binding,
    Claim,
    Confirmed,
    Evidence,
    ForbiddenTransition,
    ForgedFence,
    History,
    Ledger,
    LedgerError,
    Operation,
    Resolution,
    StaleFence,
    StaleView,
    Status,
    store,
)
from opledger.ledger import queries as q
from opledger.ledger import reviews as reviews_module
from tests.intents import key_of, prepare, prepare_isolated

T = TypeVar("T")


class Violation(AssertionError):
    """A probe's invariant broke: something a guard should refuse went through."""


# -- checks: each raises Violation ---------------------------------------------------------


def refused(call: Callable[[], object], *errors: type[Exception]) -> Exception:
    """The call raised one of `errors`; anything else (or nothing) is a violation."""
    expected = " or ".join(e.__name__ for e in errors)
    try:
        result = call()
    except errors as exc:
        return exc
    except LedgerError as exc:
        raise Violation(f"refused with {type(exc).__name__} ({exc}), not {expected}") from exc
    raise Violation(f"not refused ({expected} expected): it returned {_short(result)}")


def claim_refused(call: Callable[[], Claim | None]) -> None:
    """A claim call returned None: the operation was not handed out."""
    try:
        result = call()
    except LedgerError as exc:
        raise Violation(f"claim raised {type(exc).__name__} ({exc}) instead of None") from exc
    if result is not None:
        raise Violation(f"a claim was granted: fence {result.fence}, attempt {result.attempt_n}")


def goes_through(call: Callable[[], T]) -> T:
    try:
        return call()
    except LedgerError as exc:
        raise Violation(f"refused: {type(exc).__name__}: {exc}") from exc


def unchanged(ledger: Ledger, before: History) -> None:
    """Nothing about the operation changed: row, attempts, evidence, transitions, reviews."""
    after = ledger.history(before.operation.id)
    if after != before:
        raise Violation("the refused call changed the record:\n" + _diff(before, after))


#: the operation's columns that say where it stands and who holds it
STANDING = (
    "status",
    "fence",
    "lease_owner",
    "lease_expires_at",
    "idempotency_key",
    "provider_result_id",
    "next_check_at",
    "operator_retry_by",
)


def not_moved(ledger: Ledger, before: History) -> None:
    """The operation did not move: its standing, transitions and reviews are as they were.

    Kept facts (a closed attempt, evidence, a bumped record version) are not checked here.
    """
    after = ledger.history(before.operation.id)
    changes = _diff(before, after, fields=STANDING, parts=("transitions", "reviews"))
    if changes:
        raise Violation("the refused call moved the operation:\n" + changes)


def _short(value: object) -> str:
    if isinstance(value, Operation):
        return f"{value.id} {value.status} fence {value.fence}"
    if isinstance(value, Claim):
        return f"a claim on {value.op_id} at fence {value.fence}"
    return repr(value)[:200]


_PARTS: Mapping[str, Callable[[Any], object]] = {
    "attempts": lambda a: (a.n, a.fence, a.outcome),
    "evidence": lambda e: (e.source, e.verdict, e.applied),
    "transitions": lambda t: (str(t.from_status), str(t.to_status), t.fence, t.actor),
    "reviews": lambda r: (r.id, r.resolution, r.resolved_by),
}


def _diff(
    before: History,
    after: History,
    fields: Iterable[str] = tuple(Operation.model_fields),
    parts: Iterable[str] = tuple(_PARTS),
) -> str:
    """What differs, one line each ('' for nothing)."""
    lines = [
        f"  operation.{k}: {getattr(before.operation, k)!r} -> {getattr(after.operation, k)!r}"
        for k in fields
        if getattr(before.operation, k) != getattr(after.operation, k)
    ]
    for name in parts:
        old, new = getattr(before, name), getattr(after, name)
        if old != new:
            show = _PARTS[name]
            lines.append(f"  {name}: {[show(x) for x in old]} -> {[show(x) for x in new]}")
    return "\n".join(lines)


# -- scenes (set-up: plain asserts) --------------------------------------------------------


def _live_claim(ledger: Ledger, key: str, *, expires_at: datetime | None = None) -> Claim:
    """Dispatching at fence 1, its lease live for minutes."""
    op_id = prepare_isolated(ledger, key, expires_at=expires_at)
    claim = ledger.claim(op_id, owner="worker-1", lease=timedelta(minutes=5))
    assert claim is not None
    return claim


def _receipt(claim: Claim) -> Confirmed:
    return Confirmed(
        receipt_id=f"rcpt-{claim.attempt_n}", binding=Binding(idempotency_key=claim.idempotency_key)
    )


def _unknown(ledger: Ledger, key: str, *, expires_at: datetime | None = None) -> Claim:
    """Unknown at the claim's fence: the worker reported an ambiguous outcome."""
    claim = _live_claim(ledger, key, expires_at=expires_at)
    ledger.record_outcome(claim, Ambiguous(code="timeout", reason="read timed out"))
    return claim


def _settled_by_worker(ledger: Ledger, key: str) -> Claim:
    """Confirmed by the worker's receipt, at the claim's fence (an outcome keeps the fence)."""
    claim = _live_claim(ledger, key)
    assert ledger.record_outcome(claim, _receipt(claim)).status is Status.CONFIRMED
    return claim


def _lookup(ledger: Ledger, op_id: str, verdict: str) -> Evidence:
    """What a reconciler's status lookup found."""
    return ledger.record_evidence(
        op_id,
        source="lookup",
        verdict=verdict,
        binding=Binding(idempotency_key=key_of(ledger, op_id), receipt_id="rcpt-1"),
    )


def _retried_under_review(ledger: Ledger, key: str) -> Claim:
    """Unknown and handed to a person; then claimed for a retry while the review is still
    open (a claim does not close reviews), and shown to alice as it stands now."""
    first = _unknown(ledger, key)
    assert ledger.open_review(first.op_id, fence=first.fence, reason="nothing decisive")
    retry = ledger.claim_retry(first.op_id, owner="worker-2", expected_fence=first.fence)
    assert retry is not None and retry.fence == first.fence + 1
    ledger.reviews.show(first.op_id, tenant="acme", operator="alice")
    return retry


# -- probes: settle on evidence (SETTLE_ON_EVIDENCE) -----------------------------------------


def probe_resolve_refuses_a_live_claim(ledger: Ledger) -> None:
    """A reconciler read fence 1 while the worker's claim (fence 1) was live; settling on
    that fence must leave the dispatching operation to its worker."""
    claim = _live_claim(ledger, "live")
    ev = _lookup(ledger, claim.op_id, "confirmed")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.settle(
            claim.op_id,
            fence=claim.fence,
            to=Status.CONFIRMED,
            evidence_id=ev.id,
            actor="reconciler",
            reason="lookup found it",
        ),
        StaleFence,
    )
    unchanged(ledger, before)
    goes_through(lambda: ledger.record_outcome(claim, _receipt(claim)))


def probe_resolve_refuses_an_operation_its_worker_settled(ledger: Ledger) -> None:
    """The worker's receipt settled the operation at fence 1; a reconciler that decided on
    fence 1 must not settle it a second time (no second transition, evidence not applied)."""
    claim = _settled_by_worker(ledger, "settled")
    ev = _lookup(ledger, claim.op_id, "confirmed")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.settle(
            claim.op_id,
            fence=claim.fence,
            to=Status.CONFIRMED,
            evidence_id=ev.id,
            actor="reconciler",
            reason="lookup found it",
        ),
        StaleFence,
    )
    unchanged(ledger, before)


def probe_a_settled_operation_never_flips(ledger: Ledger) -> None:
    """Confirmed by its worker at fence 1, then a lookup says rejected: the operation stays
    confirmed. SETTLE_ON_EVIDENCE's status guard refuses it (StaleFence); without it, the transition
    trigger does (ForbiddenTransition)."""
    claim = _settled_by_worker(ledger, "flip")
    ev = _lookup(ledger, claim.op_id, "rejected")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.settle(
            claim.op_id,
            fence=claim.fence,
            to=Status.REJECTED,
            evidence_id=ev.id,
            actor="reconciler",
            reason="lookup says rejected",
        ),
        StaleFence,
        ForbiddenTransition,
    )
    unchanged(ledger, before)


# -- probes: SCHEDULE_CHECK, OPEN_REVIEW ------------------------------------------------------


def probe_schedule_check_refuses_a_live_claim(ledger: Ledger) -> None:
    claim = _live_claim(ledger, "live")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.schedule_check(
            claim.op_id, fence=claim.fence, at=datetime.now(UTC) + timedelta(hours=1)
        ),
        StaleFence,
    )
    unchanged(ledger, before)


def probe_open_review_refuses_a_live_claim(ledger: Ledger) -> None:
    claim = _live_claim(ledger, "live")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.open_review(claim.op_id, fence=claim.fence, reason="nothing decisive"),
        StaleFence,
    )
    unchanged(ledger, before)


def probe_open_review_refuses_an_operation_its_worker_settled(ledger: Ledger) -> None:
    claim = _settled_by_worker(ledger, "settled")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.open_review(claim.op_id, fence=claim.fence, reason="nothing decisive"),
        StaleFence,
    )
    unchanged(ledger, before)


# -- probes: the operator's resolution (SETTLE_BY_OPERATOR, AUTHORIZE_RETRY) ------------------


def _operator_refused(ledger: Ledger, retry: Claim, **how: Any) -> None:
    before = ledger.history(retry.op_id)
    refused(
        lambda: ledger.reviews.resolve(
            retry.op_id, tenant="acme", operator="alice", note="checked the CRM", **how
        ),
        StaleView,
    )
    unchanged(ledger, before)
    if ledger.reviews.audit(retry.op_id, tenant="acme"):
        raise Violation("a refused resolution left an audit row")
    goes_through(lambda: ledger.record_outcome(retry, _receipt(retry)))


def probe_operator_cannot_settle_a_retry_in_flight(ledger: Ledger) -> None:
    """An open review, but the operation was claimed again and is dispatching: settling it
    as confirmed would pre-empt the live claim (dispatching -> confirmed is a legal move)."""
    _operator_refused(ledger, _retried_under_review(ledger, "settle"), resolution="confirmed")


def probe_operator_cannot_authorize_a_retry_over_a_retry_in_flight(ledger: Ledger) -> None:
    """The same, resolved as a retry: authorizing it would move the fence (and the key) from
    under the live claim."""
    _operator_refused(
        ledger, _retried_under_review(ledger, "retry"), resolution=Resolution.RETRY, new_key=True
    )


# -- probes: the outcome (RECORD_OUTCOME) ------------------------------------------------------


def probe_a_forged_token_cannot_move_the_operation(ledger: Ledger) -> None:
    """Right fence, wrong token: the claim token is checked on the attempt row and on the
    operation; either check alone keeps the operation where it is."""
    claim = _live_claim(ledger, "forged")
    forged = claim.model_copy(update={"token": "0" * 32})
    before = ledger.history(claim.op_id)
    refused(lambda: ledger.record_outcome(forged, _receipt(claim)), ForgedFence)
    not_moved(ledger, before)


def probe_a_forged_token_leaves_the_attempt_to_its_claim(ledger: Ledger) -> None:
    """Only the attempt row's token check keeps a forged outcome off the attempt (and out of
    the evidence), so the genuine claim can still report."""
    claim = _live_claim(ledger, "forged")
    forged = claim.model_copy(update={"token": "0" * 32})
    before = ledger.history(claim.op_id)
    refused(lambda: ledger.record_outcome(forged, _receipt(claim)), ForgedFence)
    unchanged(ledger, before)
    goes_through(lambda: ledger.record_outcome(claim, _receipt(claim)))


def probe_a_second_report_cannot_move_the_operation(ledger: Ledger) -> None:
    """The claim reported ambiguous (unknown, same fence); a second report under it must not
    settle the operation. Three conditions refuse it: the attempt is closed, the lease token
    is gone, the status is no longer dispatching."""
    claim = _unknown(ledger, "twice")
    before = ledger.history(claim.op_id)
    refused(lambda: ledger.record_outcome(claim, _receipt(claim)), StaleFence)
    not_moved(ledger, before)


def probe_a_second_report_leaves_the_first_on_record(ledger: Ledger) -> None:
    """Only the open-attempt check keeps the first outcome on the attempt as reported."""
    claim = _unknown(ledger, "twice")
    before = ledger.history(claim.op_id)
    refused(lambda: ledger.record_outcome(claim, _receipt(claim)), StaleFence)
    unchanged(ledger, before)


# -- probes: the claim (CLAIM) -----------------------------------------------------------------


def probe_a_live_claim_cannot_be_claimed_again(ledger: Ledger) -> None:
    """A redelivered dispatch or a retry while the worker holds a live lease: refused by the
    status (dispatching) and by the live lease, each alone."""
    claim = _live_claim(ledger, "taken")
    before = ledger.history(claim.op_id)
    claim_refused(lambda: ledger.claim(claim.op_id, owner="worker-2"))
    claim_refused(
        lambda: ledger.claim_retry(
            claim.op_id, owner="worker-2", expected_fence=before.operation.fence
        )
    )
    unchanged(ledger, before)


def probe_a_claim_takes_only_the_status_it_names(ledger: Ledger) -> None:
    """A redelivered first dispatch must not claim an unknown operation (a retry is
    reconcile's decision), nor a retry claim a prepared one. Neither holds a lease."""
    unknown = _unknown(ledger, "unknown").op_id
    prepared = prepare_isolated(ledger, "prepared")
    before = [ledger.history(unknown), ledger.history(prepared)]
    claim_refused(lambda: ledger.claim(unknown, owner="worker-2"))
    claim_refused(
        lambda: ledger.claim_retry(
            prepared, owner="worker-2", expected_fence=before[1].operation.fence
        )
    )
    for history in before:
        unchanged(ledger, history)


def probe_a_retry_claim_needs_the_fence_its_decision_saw(ledger: Ledger) -> None:
    """Reconcile decided a retry at fence 1, but another retry ran and ended unknown at
    fence 2 meanwhile: same status, another fence."""
    first = _unknown(ledger, "decided")
    other = ledger.claim_retry(first.op_id, owner="worker-2", expected_fence=first.fence)
    assert other is not None
    ledger.record_outcome(other, Ambiguous(code="timeout", reason="lost again"))
    before = ledger.history(first.op_id)
    claim_refused(
        lambda: ledger.claim_retry(first.op_id, owner="worker-3", expected_fence=first.fence)
    )
    unchanged(ledger, before)


def probe_a_revoked_grant_stops_a_retry(ledger: Ledger) -> None:
    claim = _unknown(ledger, "revoked")
    ledger.revoke(claim.operation.authorization_ref, by="security", reason="key leaked")
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.claim_retry(
            claim.op_id, owner="worker-2", expected_fence=before.operation.fence
        ),
        AuthorizationRevoked,
    )
    unchanged(ledger, before)


def probe_an_expired_grant_stops_a_retry(ledger: Ledger) -> None:
    expires = datetime.now(UTC) + timedelta(seconds=0.5)
    claim = _unknown(ledger, "expired", expires_at=expires)
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    before = ledger.history(claim.op_id)
    refused(
        lambda: ledger.claim_retry(
            claim.op_id, owner="worker-2", expected_fence=before.operation.fence
        ),
        AuthorizationRevoked,
    )
    unchanged(ledger, before)


def probe_a_dependent_waits_for_its_dependency(ledger: Ledger) -> None:
    """An operation prepared to run after another is not claimed while that one is still
    unknown (ordered effects, migration 0008): its message is a no-op."""
    dependency = _unknown(ledger, "dependency")
    op = ledger.get(dependency.op_id)
    dependent = prepare(
        ledger,
        "dependent",
        workflow_id=op.workflow_id,
        authorization_ref=op.authorization_ref,
        after=[op.id],
    )
    before = ledger.history(dependent)
    claim_refused(lambda: ledger.claim(dependent, owner="worker-2"))
    unchanged(ledger, before)


Probe = Callable[[Ledger], None]

PROBES: Sequence[Probe] = (
    probe_resolve_refuses_a_live_claim,
    probe_resolve_refuses_an_operation_its_worker_settled,
    probe_a_settled_operation_never_flips,
    probe_schedule_check_refuses_a_live_claim,
    probe_open_review_refuses_a_live_claim,
    probe_open_review_refuses_an_operation_its_worker_settled,
    probe_operator_cannot_settle_a_retry_in_flight,
    probe_operator_cannot_authorize_a_retry_over_a_retry_in_flight,
    probe_a_forged_token_cannot_move_the_operation,
    probe_a_forged_token_leaves_the_attempt_to_its_claim,
    probe_a_second_report_cannot_move_the_operation,
    probe_a_second_report_leaves_the_first_on_record,
    probe_a_live_claim_cannot_be_claimed_again,
    probe_a_claim_takes_only_the_status_it_names,
    probe_a_retry_claim_needs_the_fence_its_decision_saw,
    probe_a_revoked_grant_stops_a_retry,
    probe_an_expired_grant_stops_a_retry,
    probe_a_dependent_waits_for_its_dependency,
)


@pytest.fixture(autouse=True)
def _no_provider_pressure(session_ledger: Ledger) -> None:
    """These tests share the database untruncated, isolated by workflow and grant; a
    provider's pause is fleet-wide, so one an earlier test left (a 429 waited out) would
    refuse their claims: forgotten first."""
    for state in session_ledger.providers():
        session_ledger.forget_provider(state.provider)


def _name(probe: Probe) -> str:
    return probe.__name__.removeprefix("probe_")


@pytest.mark.parametrize("probe", PROBES, ids=_name)
def test_the_guard_holds(session_ledger: Ledger, probe: Probe) -> None:
    probe(session_ledger)


# -- removing guards ---------------------------------------------------------------------------


class Guard(Protocol):
    """A condition that refuses something; `removed` takes it away for a block."""

    @property
    def name(self) -> str: ...

    def removed(self, ledger: Ledger) -> AbstractContextManager[None]: ...


def without(statement: TextClause, guard: str) -> TextClause:
    """`statement` with the text `guard` cut out, its typed bind parameters kept."""
    mutated = text(statement.text.replace(guard, "", 1))
    typed = [
        bindparam(name, type_=param.type)
        for name, param in statement._bindparams.items()
        if not isinstance(param.type, NullType) and name in mutated._bindparams
    ]
    return mutated.bindparams(*typed) if typed else mutated


@dataclass(frozen=True)
class SqlGuard:
    """A condition in one statement of `opledger.ledger.queries`, matched narrowly."""

    statement: str
    text: str
    label: str

    @property
    def name(self) -> str:
        return f"{self.statement}.{self.label}"

    @contextmanager
    def removed(self, ledger: Ledger) -> Iterator[None]:
        original: TextClause = getattr(q, self.statement)
        found = original.text.count(self.text)
        assert found == 1, (
            f"{self.statement} holds {self.text!r} {found} times, not once: "
            "the SQL was rewritten; update this guard's text"
        )
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(q, self.statement, without(original, self.text))
            yield


class _TransitionTrigger:
    """The database trigger that keeps every status change on the state machine."""

    name = "trigger"

    @contextmanager
    def removed(self, ledger: Ledger) -> Iterator[None]:
        with ledger.engine.begin() as conn:
            conn.execute(text("ALTER TABLE operations DISABLE TRIGGER opledger_guard_operation"))
        try:
            yield
        finally:
            with ledger.engine.begin() as conn:
                conn.execute(text("ALTER TABLE operations ENABLE TRIGGER opledger_guard_operation"))


class _ReadsUnknown:
    """Stands in for the row mapping (`opledger.ledger.store`) inside
    `opledger.ledger.reviews`: `Reviews.resolve` reads every operation as unknown, as if its
    status check (under the row lock) were not there. Everything else is the real mapping."""

    @staticmethod
    def operation(row: Any) -> Operation:
        m = row._mapping
        data = {name: m[name] for name in Operation.model_fields}
        return Operation.model_validate({**data, "status": Status.UNKNOWN})

    def __getattr__(self, name: str) -> Any:
        return getattr(store, name)


class _ReviewStatusCheck:
    """`Reviews.resolve` refuses an operation that is no longer unknown before it runs
    SETTLE_BY_OPERATOR or AUTHORIZE_RETRY."""

    name = "Reviews.resolve.status_check"

    @contextmanager
    def removed(self, ledger: Ledger) -> Iterator[None]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(reviews_module, "store", _ReadsUnknown())
            yield


TRIGGER = _TransitionTrigger()
REVIEW_STATUS_CHECK = _ReviewStatusCheck()

SETTLE_STATUS_GUARD = SqlGuard("SETTLE_ON_EVIDENCE", "AND o.status = 'unknown'", "status")
SCHEDULE_CHECK_STATUS = SqlGuard("SCHEDULE_CHECK", "AND o.status = 'unknown'", "status")
OPEN_REVIEW_STATUS = SqlGuard("OPEN_REVIEW", "AND o.status = 'unknown'", "status")
SETTLE_STATUS = SqlGuard("SETTLE_BY_OPERATOR", "AND o.status = 'unknown'", "status")
RETRY_STATUS = SqlGuard("AUTHORIZE_RETRY", "AND o.status = 'unknown'", "status")
OUTCOME_ATTEMPT_TOKEN = SqlGuard("RECORD_OUTCOME", "AND claim_token = :token", "attempt_token")
OUTCOME_LEASE_TOKEN = SqlGuard("RECORD_OUTCOME", "AND o.lease_token = :token", "lease_token")
OUTCOME_STATUS = SqlGuard("RECORD_OUTCOME", "AND o.status = 'dispatching'", "status")
OUTCOME_OPEN_ATTEMPT = SqlGuard("RECORD_OUTCOME", "AND finished_at IS NULL", "open_attempt")
CLAIM_STATUS = SqlGuard("CLAIM", "AND o.status = CAST(:from_status AS op_status)", "status")
CLAIM_LEASE = SqlGuard(
    "CLAIM", "AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())", "lease"
)
CLAIM_FENCE = SqlGuard(
    "CLAIM",
    "AND (CAST(:expected_fence AS bigint) IS NULL OR o.fence = :expected_fence)",
    "expected_fence",
)
CLAIM_DEPENDENCIES = SqlGuard("CLAIM", "AND o.waiting_on = 0", "dependencies")
CLAIM_NOT_REVOKED = SqlGuard("CLAIM", "a.revoked_at IS NULL AND ", "not_revoked")
CLAIM_NOT_EXPIRED = SqlGuard(
    "CLAIM", " AND (a.expires_at IS NULL OR a.expires_at > now())", "not_expired"
)


@dataclass(frozen=True)
class Mutant:
    probe: Probe
    removed: tuple[Guard, ...]
    #: True: the probe must detect the violation; False: what is left still holds
    detected: bool

    @property
    def id(self) -> str:
        gone = "+".join(g.name for g in self.removed)
        return f"{_name(self.probe)}-without-{gone}-{'detected' if self.detected else 'holds'}"


def _one_by_one(probe: Probe, *guards: Guard) -> list[Mutant]:
    """Conditions that protect the same property on purpose: with all but one removed the
    property holds (for each one in turn); with all removed the probe detects it."""
    return [
        *(Mutant(probe, tuple(g for g in guards if g is not kept), False) for kept in guards),
        Mutant(probe, guards, True),
    ]


MUTANTS: Sequence[Mutant] = (
    # a single guard: without it the violation goes through
    Mutant(probe_resolve_refuses_a_live_claim, (SETTLE_STATUS_GUARD,), True),
    Mutant(probe_resolve_refuses_an_operation_its_worker_settled, (SETTLE_STATUS_GUARD,), True),
    Mutant(probe_schedule_check_refuses_a_live_claim, (SCHEDULE_CHECK_STATUS,), True),
    Mutant(probe_open_review_refuses_a_live_claim, (OPEN_REVIEW_STATUS,), True),
    Mutant(probe_open_review_refuses_an_operation_its_worker_settled, (OPEN_REVIEW_STATUS,), True),
    Mutant(probe_a_forged_token_leaves_the_attempt_to_its_claim, (OUTCOME_ATTEMPT_TOKEN,), True),
    Mutant(probe_a_second_report_leaves_the_first_on_record, (OUTCOME_OPEN_ATTEMPT,), True),
    Mutant(probe_a_claim_takes_only_the_status_it_names, (CLAIM_STATUS,), True),
    Mutant(probe_a_retry_claim_needs_the_fence_its_decision_saw, (CLAIM_FENCE,), True),
    Mutant(probe_a_revoked_grant_stops_a_retry, (CLAIM_NOT_REVOKED,), True),
    Mutant(probe_an_expired_grant_stops_a_retry, (CLAIM_NOT_EXPIRED,), True),
    Mutant(probe_a_dependent_waits_for_its_dependency, (CLAIM_DEPENDENCIES,), True),
    # deliberate double (and triple) conditions, each removed in turn
    *_one_by_one(probe_a_settled_operation_never_flips, SETTLE_STATUS_GUARD, TRIGGER),
    *_one_by_one(
        probe_operator_cannot_settle_a_retry_in_flight, SETTLE_STATUS, REVIEW_STATUS_CHECK
    ),
    *_one_by_one(
        probe_operator_cannot_authorize_a_retry_over_a_retry_in_flight,
        RETRY_STATUS,
        REVIEW_STATUS_CHECK,
    ),
    *_one_by_one(
        probe_a_forged_token_cannot_move_the_operation, OUTCOME_ATTEMPT_TOKEN, OUTCOME_LEASE_TOKEN
    ),
    *_one_by_one(
        probe_a_second_report_cannot_move_the_operation,
        OUTCOME_OPEN_ATTEMPT,
        OUTCOME_LEASE_TOKEN,
        OUTCOME_STATUS,
    ),
    *_one_by_one(probe_a_live_claim_cannot_be_claimed_again, CLAIM_STATUS, CLAIM_LEASE),
)


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_removing_guards(session_ledger: Ledger, mutant: Mutant) -> None:
    ledger = session_ledger
    with ExitStack() as stack:
        for guard in mutant.removed:
            stack.enter_context(guard.removed(ledger))
        if mutant.detected:
            with pytest.raises(Violation):
                mutant.probe(ledger)
        else:
            mutant.probe(ledger)
