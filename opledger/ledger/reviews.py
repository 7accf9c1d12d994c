"""The operator review queue: list, show (recorded), resolve (fenced and audited).

Every call is scoped to one tenant: another tenant's operations are invisible, as if they
did not exist. A resolution must come from the latest view the operator was shown; if the
operation moved since, it is refused, so nobody decides on a picture that is out of date.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

from pydantic import AwareDatetime
from sqlalchemy import Connection

from . import queries as q
from . import store
from .consequences import Consequences, consequences
from .contract import Contract
from .errors import (
    ContradictsEvidence,
    InvalidInput,
    OperationNotFound,
    ReviewAlreadyResolved,
    ReviewNotFound,
    StaleView,
)
from .ids import (
    check_action,
    check_identifier,
    check_key,
    check_operation_id,
    check_operator,
    check_text,
)
from .models import (
    Attempt,
    Evidence,
    History,
    Operation,
    Record,
    Review,
    Status,
)
from .resolution import (
    Resolution,
    changes_since,
    check_fits,
    contradicted,
    resolution_of,
    retry_terms,
)
from .store import Store


class ReviewSummary(Record):
    review_id: int
    op_id: str
    tenant: str
    action: str
    target: str
    reason: str
    opened_at: AwareDatetime
    record_version: int


class ReviewCount(Record):
    """Open reviews of one tenant with one action and one reason."""

    action: str
    reason: str
    n: int
    oldest: AwareDatetime


class ReviewView(Record):
    """What `show` presents, and what a resolution is checked against."""

    review: Review
    operation: Operation
    attempts: tuple[Attempt, ...]
    evidence: tuple[Evidence, ...]
    consequences: Consequences | None
    contract: Contract | None
    shown_at: AwareDatetime


class ReviewAction(Record):
    """One audited resolution."""

    id: int
    review_id: int
    op_id: str
    tenant: str
    operator: str
    resolution: Resolution
    note: str
    evidence: str | None
    new_key: str | None
    fence: int
    shown: dict[str, Any]
    #: the resolution contradicted bound evidence on record and the operator overrode it
    override_evidence: bool = False
    #: a retry that could repeat the effect, acknowledged by the operator
    risk_acknowledged: bool = False
    at: AwareDatetime


class Reviews:
    """`ledger.reviews`: the same operations the CLI offers, for a console or a script."""

    def __init__(self, db: Store, contracts: Callable[[str], Contract] | None) -> None:
        self._db = db
        self._contracts = contracts

    def _contract(self, action: str) -> Contract | None:
        if self._contracts is None:
            return None
        try:
            return self._contracts(action)
        except Exception:  # an action whose adapter is gone: no consequences, no guessing
            return None

    def list(
        self,
        *,
        tenant: str,
        older_than: timedelta | None = None,
        action: str | None = None,
        reason: str | None = None,
        limit: int = 100,
    ) -> tuple[ReviewSummary, ...]:
        """Open reviews of `tenant`, oldest first; `action` may end in '*' (a prefix);
        `reason` is a case-insensitive part of the review's reason."""
        tenant = check_key("tenant", tenant)
        reason_pattern = None
        if reason is not None and reason.strip():
            check_identifier("reason", reason)
            escaped = reason.strip().replace("\\", "\\\\").replace("%", r"\%")
            reason_pattern = "%" + escaped.replace("_", r"\_") + "%"
        pattern = None
        if action is not None:
            if action.endswith("*"):
                check_identifier("action", action)
                pattern = action[:-1].replace("%", r"\%").replace("_", r"\_") + "%"
            else:
                pattern = check_action(action).replace("_", r"\_")
        with self._db.statement() as conn:
            rows = conn.execute(
                q.LIST_REVIEWS,
                {
                    "tenant": tenant,
                    "older_than": older_than,
                    "action": pattern,
                    "reason": reason_pattern,
                    "limit": max(1, min(limit, 10_000)),
                },
            )
            return tuple(ReviewSummary.model_validate(dict(r._mapping)) for r in rows)

    def counts(self, *, tenant: str) -> tuple[ReviewCount, ...]:
        """Open reviews of `tenant` counted by action and reason, oldest group first."""
        tenant = check_key("tenant", tenant)
        with self._db.statement() as conn:
            rows = conn.execute(q.COUNT_REVIEWS, {"tenant": tenant})
            return tuple(ReviewCount.model_validate(dict(r._mapping)) for r in rows)

    def tenants_with_open_reviews(self) -> tuple[tuple[str, int], ...]:
        """Every tenant with open reviews and how many (for an operator of all tenants)."""
        with self._db.statement() as conn:
            return tuple((r.tenant, int(r.n)) for r in conn.execute(q.OPEN_REVIEW_TENANTS))

    def search(
        self,
        *,
        tenant: str,
        op_id: str | None = None,
        workflow_id: str | None = None,
        target: str | None = None,
        limit: int = 100,
    ) -> tuple[Operation, ...]:
        """Operations of `tenant` with this id, workflow id or target (exact; NFC like
        `prepare`), newest first. At least one of the three is required."""
        tenant = check_key("tenant", tenant)
        if op_id is not None:
            check_operation_id(op_id)
        if workflow_id is not None:
            workflow_id = check_key("workflow_id", workflow_id)
        if target is not None:
            target = check_key("target", target)
        if op_id is None and workflow_id is None and target is None:
            raise InvalidInput("search by an operation id, a workflow id or a target")
        with self._db.statement() as conn:
            rows = conn.execute(
                q.SEARCH_OPERATIONS,
                {
                    "tenant": tenant,
                    "op_id": op_id,
                    "workflow_id": workflow_id,
                    "target": target,
                    "limit": max(1, min(limit, 1000)),
                },
            )
            return tuple(store.operation(r) for r in rows)

    def history(self, op_id: str, *, tenant: str) -> History:
        """Everything recorded about `op_id`, if it is `tenant`'s; another tenant's
        operation is `OperationNotFound`, exactly like one that does not exist."""
        check_operation_id(op_id)
        tenant = check_key("tenant", tenant)
        with self._db.snapshot() as conn:
            history = self._db.history(conn, op_id)
        if history.operation.tenant != tenant:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        return history

    def payload(self, op_id: str, *, tenant: str) -> dict[str, Any] | None:
        """The frozen payload of `tenant`'s operation `op_id`; None once purged."""
        check_operation_id(op_id)
        tenant = check_key("tenant", tenant)
        with self._db.snapshot() as conn:
            row = conn.execute(q.SELECT_OPERATION, {"op_id": op_id}).one_or_none()
            if row is None or row.tenant != tenant:
                raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
            return self._db.payload(conn, op_id)

    def show(self, op_id: str, *, tenant: str, operator: str) -> ReviewView:
        """Everything a reviewer needs, recorded as this operator's latest view."""
        check_operation_id(op_id)
        tenant = check_key("tenant", tenant)
        operator = check_operator("operator", operator)
        with self._db.snapshot() as conn:
            row = conn.execute(q.OPEN_REVIEW_FOR, {"op_id": op_id, "tenant": tenant}).one_or_none()
            if row is None:
                self._raise_missing(conn, op_id, tenant)
            history = self._db.history(conn, op_id)
        review = next(r for r in history.reviews if r.id == row.id)
        contract = self._contract(history.operation.action)
        now = datetime.now(UTC)
        effects = (
            consequences(contract, history.operation, history.attempts, now, history.evidence)
            # a settled operation's review moves nothing: no resolution has consequences
            if contract and not history.operation.status.final
            else None
        )
        view = ReviewView(
            review=review,
            operation=history.operation,
            attempts=history.attempts,
            evidence=history.evidence,
            consequences=effects,
            contract=contract,
            shown_at=now,
        )
        with self._db.transaction() as conn:
            conn.execute(
                q.INSERT_VIEW,
                {
                    "review_id": review.id,
                    "operator": operator,
                    "record_version": history.operation.record_version,
                    "shown": store.to_json(_shown(view)),
                },
            )
        return view

    def resolve(
        self,
        op_id: str,
        *,
        tenant: str,
        operator: str,
        resolution: Resolution | str,
        note: str,
        evidence: str | None = None,
        new_key: bool = False,
        seen_version: int | None = None,
        acknowledge_risk: bool = False,
        override_evidence: bool = False,
    ) -> Operation:
        """Settle a review: a fenced transition plus an audit row, in one transaction.

        The same rules as the CLI, with no way around them:

        - this operator must have been shown the review (`show`), and nothing may have
          changed since that view (new evidence, a late outcome, another resolution);
          `seen_version`, when given, must also be the version of that view;
        - a retry that could repeat the effect needs the risk acknowledged: a provider
          that does not deduplicate needs `acknowledge_risk=True` (or a new key), a key
          past the provider's retention needs `new_key=True` (`RetryNeedsAcknowledgement`,
          `RetryNeedsNewKey`);
        - a resolution that contradicts evidence on record binding this operation
          (rejected or retry over a receipt that confirms it, confirmed over a definitive
          refusal) needs `override_evidence=True` (`ContradictsEvidence`);
        - the review of a settled operation (a possible duplicate) is resolved as
          `acknowledged`, which moves nothing, and only so; an unknown operation's review
          never is (`ResolutionNotAllowed`).

        The audit row keeps the view the operator was shown, and both acknowledgements.
        """
        check_operation_id(op_id)
        tenant = check_key("tenant", tenant)
        operator = check_operator("operator", operator)
        note = check_text("note", note)  # a person's words: line breaks kept
        if evidence is not None:
            evidence = check_text("evidence", evidence)
        chosen = resolution_of(resolution, new_key=new_key)

        with self._db.transaction() as conn:
            review_id, op, shown, history = self._as_shown(
                conn, op_id, tenant=tenant, operator=operator, seen_version=seen_version
            )
            overriding, key, acknowledged = self._allowed(
                op,
                history,
                chosen,
                new_key=new_key,
                acknowledge_risk=acknowledge_risk,
                override_evidence=override_evidence,
            )
            reason = f"review {review_id} resolved as {chosen.value} by {operator}: {note}"
            after = self._move(conn, op, chosen, operator=operator, key=key, reason=reason)
            _close(
                conn,
                _Resolved(
                    review_id=review_id,
                    operation=after,
                    tenant=tenant,
                    operator=operator,
                    resolution=chosen,
                    note=note,
                    evidence=evidence,
                    new_key=key,
                    shown=shown,
                    overriding=bool(overriding),
                    acknowledged=acknowledged,
                ),
            )
        return after

    def _allowed(
        self,
        op: Operation,
        history: History,
        chosen: Resolution,
        *,
        new_key: bool,
        acknowledge_risk: bool,
        override_evidence: bool,
    ) -> tuple[str, str | None, bool]:
        """Whether the rules allow resolving `op` as `chosen`: raises `ContradictsEvidence`
        for a contradiction not overridden, and (`retry_terms`) for a retry whose risk was
        not acknowledged. The evidence it contradicts ('' for none), a retry's new key and
        whether its risk was acknowledged."""
        check_fits(op, chosen)
        contract = self._contract(op.action)
        overriding = contradicted(contract, op, history.attempts, history.evidence, chosen)
        if overriding and not override_evidence:
            raise ContradictsEvidence(
                f"resolving {op.id} as {chosen.value} contradicts evidence on record "
                f"({overriding}): pass an explicit override (--override-evidence) if you "
                "are sure",
                op_id=op.id,
                evidence=overriding,
            )
        if chosen is not Resolution.RETRY:
            return overriding, None, False
        key, acknowledged = retry_terms(
            contract, op, history.attempts, history.evidence, new_key, acknowledge_risk
        )
        return overriding, key, acknowledged

    def _as_shown(
        self,
        conn: Connection,
        op_id: str,
        *,
        tenant: str,
        operator: str,
        seen_version: int | None,
    ) -> tuple[int, Operation, dict[str, Any], History]:
        """Lock `op_id`'s open review and check it is as `operator` was last shown it: the
        review's id, the operation, what was shown, and the history under the lock."""
        row = conn.execute(q.LOCK_OPEN_REVIEW, {"op_id": op_id, "tenant": tenant}).one_or_none()
        if row is None:
            self._raise_missing(conn, op_id, tenant)
        op = store.operation(row)
        view = conn.execute(
            q.LAST_VIEW, {"review_id": row.review_id, "operator": operator}
        ).one_or_none()
        if view is None:
            raise StaleView(
                f"{operator} has not been shown the review of {op_id}: run `review show` first",
                op_id=op_id,
            )
        seen = view.record_version
        if seen_version is not None and seen_version != seen:
            raise StaleView(
                f"{operator} was last shown {op_id} at version {seen}, not "
                f"{seen_version}: show it again before deciding",
                op_id=op_id,
                seen=seen,
                current=op.record_version,
            )
        shown: dict[str, Any] = dict(view.shown)
        history = self._db.history(conn, op_id)  # under the lock just taken
        # an unknown operation's review decides its status; a settled one's (a possible
        # duplicate) stands on a status nothing moves any more (every move of a status
        # bumps the record's version, so one shown another status is refused either way)
        settled = op.status.final
        if seen != op.record_version or not (settled or op.status is Status.UNKNOWN):
            changes = changes_since(shown, history)
            raise StaleView(
                f"{op_id} changed since it was shown (version {seen}, now "
                f"{op.record_version}, status {op.status}): show it again before deciding"
                f"; what changed: {'; '.join(changes)}",
                op_id=op_id,
                seen=seen,
                current=op.record_version,
                changes=changes,
            )
        return int(row.review_id), op, shown, history

    @staticmethod
    def _move(
        conn: Connection,
        op: Operation,
        chosen: Resolution,
        *,
        operator: str,
        key: str | None,
        reason: str,
    ) -> Operation:
        """The resolution's one fenced transition: a retry authorized, or the status set;
        none for an acknowledgement (the operation stays as it is)."""
        if chosen is Resolution.ACKNOWLEDGED:
            return op
        params = {"op_id": op.id, "fence": op.fence, "operator": operator, "reason": reason}
        if chosen is Resolution.RETRY:
            moved = conn.execute(q.AUTHORIZE_RETRY, {**params, "new_key": key}).one_or_none()
        else:
            to = {
                Resolution.CONFIRMED: Status.CONFIRMED,
                Resolution.REJECTED: Status.REJECTED,
                Resolution.CANCEL: Status.CANCELLED,
            }[chosen]
            moved = conn.execute(
                q.SETTLE_BY_OPERATOR, {**params, "to_status": to.value}
            ).one_or_none()
        if moved is None:  # the row lock makes this unreachable, but never assume
            raise StaleView(f"{op.id} moved while resolving", op_id=op.id)
        return store.operation(moved)

    def audit(self, op_id: str, *, tenant: str) -> tuple[ReviewAction, ...]:
        """Every resolution of `op_id`'s reviews, oldest first."""
        check_operation_id(op_id)
        tenant = check_key("tenant", tenant)
        with self._db.statement() as conn:
            rows = conn.execute(q.SELECT_REVIEW_ACTIONS, {"op_id": op_id, "tenant": tenant})
            return tuple(ReviewAction.model_validate(dict(r._mapping)) for r in rows)

    def _raise_missing(self, conn: Any, op_id: str, tenant: str) -> NoReturn:
        done = conn.execute(
            q.LAST_RESOLVED_REVIEW, {"op_id": op_id, "tenant": tenant}
        ).one_or_none()
        if done is not None:
            raise ReviewAlreadyResolved(
                f"the review of {op_id} was already resolved as {done.resolution} by "
                f"{done.resolved_by} at {done.resolved_at:%Y-%m-%d %H:%M:%S %Z}",
                op_id=op_id,
            )
        raise ReviewNotFound(f"no open review for {op_id} in tenant {tenant!r}", op_id=op_id)


def _shown(view: ReviewView) -> dict[str, Any]:
    """What the operator saw, kept with the view and copied into the audit row."""
    return {
        "record_version": view.operation.record_version,
        "status": view.operation.status.value,
        "reason": view.review.reason,
        "attempts": [a.model_dump(mode="json") for a in view.attempts],
        "evidence": [e.model_dump(mode="json") for e in view.evidence],
        "consequences": view.consequences.model_dump(mode="json") if view.consequences else None,
        "shown_at": view.shown_at.isoformat(),
    }


@dataclass(frozen=True)
class _Resolved:
    """What a resolution records besides the move itself."""

    review_id: int
    operation: Operation  # as the move left it
    tenant: str
    operator: str
    resolution: Resolution
    note: str
    evidence: str | None
    new_key: str | None
    shown: dict[str, Any]
    overriding: bool
    acknowledged: bool


def _close(conn: Connection, r: _Resolved) -> None:
    """The operator's evidence (for a confirmed or rejected verdict), the closed review and
    the audit row with the view the operator was shown, in the resolution's transaction."""
    op = r.operation
    if r.resolution in (Resolution.CONFIRMED, Resolution.REJECTED):
        conn.execute(
            q.OPERATOR_EVIDENCE,
            {
                "op_id": op.id,
                "fence": op.fence,
                "verdict": r.resolution.value,
                "detail": store.to_json(
                    {"operator": r.operator, "note": r.note, "evidence": r.evidence}
                ),
            },
        )
    conn.execute(
        q.CLOSE_REVIEW,
        {
            "review_id": r.review_id,
            "resolution": r.resolution.value,
            "operator": r.operator,
            "note": r.note,
        },
    )
    conn.execute(
        q.INSERT_REVIEW_ACTION,
        {
            "review_id": r.review_id,
            "op_id": op.id,
            "tenant": r.tenant,
            "operator": r.operator,
            "resolution": r.resolution.value,
            "note": r.note,
            "evidence": r.evidence,
            "new_key": r.new_key,
            "fence": op.fence,
            "shown": store.to_json(r.shown),
            "override_evidence": r.overriding,
            "risk_acknowledged": r.acknowledged,
        },
    )
