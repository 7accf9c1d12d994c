"""The ledger's Python API: `Ledger`, one class made of its parts, one module each —
`prepare` (intents and asks), `claims` (the worker's fenced claim and outcome), `grants`,
`maintenance` (what beat asks), over `base` (engine, limits, reads) — plus what is left
here: opening a ledger, reconciliation (evidence, settle, checks, reviews), cancel, list.

All SQL the ledger runs lives in `opledger.ledger.queries`, and every use of the database
goes through `opledger.ledger.store` (transactions, error translation, row mapping); these
modules validate input and choose the statements. The worker's happy path is two round
trips to Postgres: `claim` and `record_outcome` are one autocommitted statement each.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, NoReturn

from pydantic import SecretStr

from . import queries as q
from . import store
from .base import ActionResolver, LedgerBase, PrefixResolver
from .beats import Beats
from .canonical import DEFAULT_MAX_PAYLOAD_BYTES
from .claims import Claims, _review_params
from .connector import ledger_engine
from .errors import (
    ForbiddenTransition,
    InvalidInput,
    OperationNotFound,
    StaleFence,
)
from .evidence import with_result
from .grants import Grants
from .ids import (
    MAX_IDENTIFIER_LENGTH,
    check_action,
    check_identifier,
    check_key,
    check_operation_id,
    check_operator,
)
from .maintenance import Maintenance
from .models import (
    Binding,
    Evidence,
    EvidenceSource,
    Operation,
    Review,
    Status,
    Verdict,
)
from .payload_keys import PayloadKeys, parse_payload_keys, seal_result
from .pgschema import check_schema, schema_from_environment
from .prepare import Prepare
from .providers import Providers
from .reviews import Reviews


class Ledger(Prepare, Claims, Grants, Maintenance, Providers, Beats, LedgerBase):
    """The durable record of intended external effects, on Postgres.

    Thread-safe: each call checks a connection out of the engine's pool. Share one Ledger
    per process; after a fork, call `dispose()` in the child before first use.
    """

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        actions: ActionResolver | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        pool_size: int = 5,
        schema: str | None = None,
        payload_keys: PayloadKeys | SecretStr | str | None = None,
    ) -> Ledger:
        """A ledger on the Postgres database at `url` (any postgresql:// form), in schema
        `schema`.

        The ledger reads no setting but the schema: `schema` defaults to
        `OPLEDGER_DATABASE_SCHEMA` (`opledger` when unset). Without `payload_keys` payloads
        are written in clear; they may also be given as `OPLEDGER_PAYLOAD_KEYS`'s text
        (`key_id:base64,...`). A deployment's processes open their ledger with what its
        settings say, `Ledger.from_url(url, **settings.ledger_options())`: every process
        must name the same schema and hold every key a payload may be under.
        """
        schema = check_schema(schema) if schema is not None else schema_from_environment()
        if payload_keys is None or isinstance(payload_keys, PayloadKeys):
            keys: PayloadKeys | None = payload_keys
        elif isinstance(payload_keys, SecretStr):
            keys = parse_payload_keys(payload_keys.get_secret_value())
        else:
            keys = parse_payload_keys(payload_keys)
        engine = ledger_engine(
            url, schema=schema, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800
        )
        return cls(
            engine,
            actions=actions,
            max_payload_bytes=max_payload_bytes,
            schema=schema,
            payload_keys=keys,
        )

    @property
    def reviews(self) -> Reviews:
        """The operator review queue (list, show, resolve), scoped per tenant."""
        contract_for = getattr(self.actions, "contract_for", None)
        return Reviews(self._store, contract_for if callable(contract_for) else None)

    def dispose(self) -> None:
        """Drop pooled connections (call in a forked child; never share them across fork)."""
        self._store.dispose()

    # -- reconciliation -----------------------------------------------------------------

    def record_evidence(
        self,
        op_id: str,
        *,
        source: EvidenceSource | str,
        verdict: Verdict | str,
        binding: Binding | None = None,
        detail: Mapping[str, Any] | None = None,
        attempt_n: int | None = None,
        fence: int | None = None,
    ) -> Evidence:
        """Append a fact learned about `op_id` (a lookup result, an operator's note).

        Evidence never moves the status by itself: `settle` does, citing it.
        """
        check_operation_id(op_id)
        try:
            source, verdict = EvidenceSource(source), Verdict(verdict)
        except ValueError as exc:
            raise InvalidInput(
                f"evidence source must be one of {[s.value for s in EvidenceSource]} and its "
                f"verdict one of {[v.value for v in Verdict]}: {exc}",
                field="evidence",
            ) from exc
        with self._single() as conn:
            row = conn.execute(
                q.INSERT_EVIDENCE,
                {
                    "op_id": op_id,
                    "attempt_n": attempt_n,
                    "fence": fence,
                    "source": source.value,
                    "verdict": verdict.value,
                    "binding": store.to_json(
                        (binding or Binding()).model_dump(mode="json", exclude_none=True)
                    ),
                    "detail": store.to_json(self._sealed_result(op_id, with_result(detail or {}))),
                },
            ).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        return self._store.opened(store.record(Evidence, row))

    def settle(
        self,
        op_id: str,
        *,
        fence: int,
        to: Status,
        evidence_id: int,
        actor: str,
        reason: str,
        receipt_id: str | None = None,
        review: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Settle an unknown operation as confirmed or rejected, citing the evidence.

        Conditional on `fence` (what the caller saw when it decided): when anyone moved
        the operation since, `StaleFence` is raised and nothing changes.

        `review`, given when the evidence is marked as a possible duplicate (kept from a
        fenced-out worker), is the snapshot of the review of a possible duplicate (its
        "reason" says why), opened in the same statement should this confirm: a review a
        person has open is not closed but becomes that review (reason replaced, snapshot
        merged). Ignored on a rejection.
        """
        check_operation_id(op_id)
        if to not in (Status.CONFIRMED, Status.REJECTED):
            raise ForbiddenTransition(
                f"settle moves an operation to confirmed or rejected, not {to}"
            )
        with self._single() as conn:
            row = conn.execute(
                q.SETTLE_ON_EVIDENCE,
                {
                    "op_id": op_id,
                    "fence": fence,
                    "to_status": to.value,
                    "evidence_id": evidence_id,
                    "receipt_id": receipt_id,
                    "actor": actor,
                    "reason": reason,
                    **_review_params(review if to is Status.CONFIRMED else None),
                },
            ).one_or_none()
        if row is None:
            self._raise_moved(op_id, fence)
        return store.operation(row)

    def schedule_check(self, op_id: str, *, fence: int, at: datetime) -> Operation:
        """Ask the sweeper to reconcile an unknown operation again at `at`."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(
                q.SCHEDULE_CHECK, {"op_id": op_id, "fence": fence, "next_check_at": at}
            ).one_or_none()
        if row is None:
            self._raise_moved(op_id, fence)
        return store.operation(row)

    def open_review(
        self, op_id: str, *, fence: int, reason: str, snapshot: Mapping[str, Any] | None = None
    ) -> Review | None:
        """Hand an unknown operation to a person; None if a review is already open.

        The status stays unknown until the review is resolved; the sweeper stops checking it.
        """
        check_operation_id(op_id)
        check_identifier("reason", reason, max_length=2000)
        with self._single() as conn:
            row = conn.execute(
                q.OPEN_REVIEW,
                {
                    "op_id": op_id,
                    "fence": fence,
                    "reason": reason,
                    "snapshot": store.to_json(dict(snapshot or {})),
                },
            ).one_or_none()
        if row is None:
            current = self.get(op_id)
            if current.status is not Status.UNKNOWN or current.fence != fence:
                self._raise_moved(op_id, fence)
            return None
        return store.record(Review, row)

    def _raise_moved(self, op_id: str, fence: int) -> NoReturn:
        current = self.get(op_id)
        raise StaleFence(
            f"{op_id} moved since fence {fence} (now {current.status}, fence {current.fence})",
            op_id=op_id,
            fence=fence,
            current_fence=current.fence,
            evidence_kept=False,
        )

    # -- cancel ------------------------------------------------------------------------

    def _sealed_result(self, op_id: str, detail: dict[str, Any]) -> dict[str, Any]:
        """`detail` with its result document sealed like the payload (when keys are set)."""
        if "result" in detail:
            detail["result"] = seal_result(self._store.payload_keys, op_id, detail["result"])
        return detail

    def cancel(self, op_id: str, *, reason: str, actor: str = "operator") -> Operation:
        """Cancel an operation nothing of which can have reached a provider: a prepared one,
        or an unknown one whose every attempt provably sent nothing (held because no
        adapter served its action, a refused connection, a send window that had passed)
        and that no open review holds. Anything else is refused (`ForbiddenTransition`):
        what may have taken effect is settled through its review."""
        check_operation_id(op_id)
        check_identifier("reason", reason, max_length=2000)
        actor = check_operator("actor", actor, max_length=MAX_IDENTIFIER_LENGTH)  # audited
        with self._single() as conn:
            row = conn.execute(
                q.CANCEL, {"op_id": op_id, "actor": actor, "reason": reason}
            ).one_or_none()
            if row is None:
                current = self.get(op_id)
                raise ForbiddenTransition(
                    f"{op_id} is {current.status}; only an operation nothing of which reached "
                    "a provider can be cancelled",
                    op_id=op_id,
                    status=current.status,
                )
        return store.operation(row)

    def list(
        self,
        *,
        status: Iterable[Status] | None = None,
        tenant: str | None = None,
        workflow_id: str | None = None,
        action: str | None = None,
        before: str | None = None,
        limit: int = 100,
    ) -> tuple[Operation, ...]:
        """Operations, newest first, optionally filtered by status, tenant, workflow id and
        action (exact, or a prefix ending in '*' such as 'crm.*').

        A page at a time: `before` is an operation id, and only operations older than it
        (ids are time-ordered) are listed, so the next page is `before=<the last id of this
        one>`. A malformed filter or cursor is `InvalidInput`.
        """
        try:
            statuses = [Status(s).value for s in status] if status is not None else None
        except ValueError:
            raise InvalidInput(
                f"status must be one of {', '.join(s.value for s in Status)}", field="status"
            ) from None
        if tenant is not None:
            tenant = check_key("tenant", tenant)
        if workflow_id is not None:
            workflow_id = check_key("workflow_id", workflow_id)
        pattern = None
        if action is not None:
            if action.endswith("*"):
                check_identifier("action", action, max_length=120)
                prefix = action[:-1].replace("\\", "\\\\").replace("%", r"\%")
                pattern = prefix.replace("_", r"\_") + "%"
            else:
                pattern = check_action(action).replace("_", r"\_")
        if before is not None:
            check_operation_id(before)
        with self._single() as conn:
            rows = conn.execute(
                q.LIST_OPERATIONS,
                {
                    "statuses": statuses,
                    "tenant": tenant,
                    "workflow_id": workflow_id,
                    "action": pattern,
                    "before": before,
                    "limit": max(1, min(limit, 10_000)),
                },
            )
            return tuple(store.operation(r) for r in rows)


# -- helpers -------------------------------------------------------------------------------


__all__ = ["ActionResolver", "Ledger", "PrefixResolver"]
