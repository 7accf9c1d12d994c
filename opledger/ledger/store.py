"""The ledger's rows: its records from Postgres rows, the reads every part shares.

`Ledger` and `Reviews` reach the database only through a `Store`: the connector
(`connector.Connector`: transactions, the hot path, error translation), plus the ledger's
payload keys, what this process saw of the database (its epoch, timeline and WAL) and the
reads that turn rows into records in one place. The SQL itself lives in `queries`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Connection, Engine

from . import queries as q
from .connector import Connector
from .epochs import Witness
from .errors import OperationNotFound, SchemaMissing
from .models import (
    Answer,
    Attempt,
    Authorization,
    Dependency,
    Evidence,
    History,
    Operation,
    PendingApproval,
    Review,
    Transition,
)
from .payload_keys import PayloadKeys, open_result, payload_text

R = TypeVar("R", bound=BaseModel)
F = TypeVar("F", Attempt, Evidence)


def to_json(value: Any) -> str:
    """A value as the ledger writes it into a jsonb column: compact, keys sorted (so the
    same facts are the same text), anything else as its string."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def record(model: type[R], row: Any) -> R:
    """The record `model` built from the row's columns of the same names."""
    m = row._mapping
    return model.model_validate({name: m[name] for name in model.model_fields})


def operation(row: Any) -> Operation:
    return record(Operation, row)


def operation_of(values: Sequence[Any]) -> Operation:
    """The operation from a tuple row that starts with `queries.OPERATION_COLUMNS`."""
    return Operation.model_validate(dict(zip(q.OPERATION_COLUMNS, values, strict=False)))


def authorization(row: Any) -> Authorization:
    m = dict(row._mapping)
    m["scope"] = tuple(m["scope"])
    return Authorization.model_validate({name: m[name] for name in Authorization.model_fields})


class Store(Connector):
    """The connector of a ledger: its statements, its payload keys, its rows as records.

    Thread-safe: each use checks a connection out of the engine's pool.
    """

    def __init__(
        self, engine: Engine, schema: str | None = None, payload_keys: PayloadKeys | None = None
    ) -> None:
        """A store on `engine`, in Postgres schema `schema` (`Connector`).
        `payload_keys` seal the frozen payloads it writes and open those it reads (none:
        written in clear, and only clear ones read)."""
        super().__init__(engine, schema)
        self.payload_keys = payload_keys
        #: what this process has seen of the ledger's database (its epoch, timeline, WAL)
        self.witness = Witness()
        self._key_namespace: str | None = None

    def key_namespace(self) -> str:
        """The ledger's key namespace (`ledger_identity`), read once: it never changes."""
        if self._key_namespace is None:
            # on a kept connection, as the statements that follow it (a prepare's insert):
            # a ledger used only for them never opens one of its pool
            row = self.hot(q.SELECT_KEY_NAMESPACE, {})
            found = None if row is None else row[0]
            if found is None:
                raise SchemaMissing(
                    "the ledger has no key namespace (ledger_identity is empty): "
                    "run `opledger migrate`"
                )
            self._key_namespace = str(found)
        return self._key_namespace

    # -- reads shared by the ledger and the review queue -----------------------------------

    def payload(self, conn: Connection, op_id: str) -> dict[str, Any] | None:
        """`op_id`'s frozen payload, read on `conn` and decrypted here; None when there is
        none (purged, or no such operation)."""
        row = conn.execute(q.SELECT_PAYLOAD, {"op_id": op_id}).one_or_none()
        if row is None:
            return None
        text = payload_text(self.payload_keys, op_id, row.canonical, row.key_id, row.sealed)
        assert text is not None  # a row is clear or sealed (ck_operation_payloads_sealed_or_clear)
        value: dict[str, Any] = json.loads(text)
        return value

    def opened(self, fact: F) -> F:
        """An attempt or a piece of evidence with the provider's result document it keeps
        (a response's or a detail's "result") opened, when it was sealed."""
        if isinstance(fact, Attempt):
            kept = fact.response
            field = "response"
        else:
            kept = fact.detail
            field = "detail"
        if not isinstance(kept, dict) or "result" not in kept:
            return fact
        result = open_result(self.payload_keys, fact.op_id, kept["result"])
        if result is kept["result"]:
            return fact
        return fact.model_copy(update={field: {**kept, "result": result}})

    def answer(self, values: Sequence[Any]) -> Answer:
        """The answer a `queries.SELECT_ANSWERS` row (a tuple) gives, its result document
        opened."""
        op = operation_of(values)
        last_reason, detail, review, blocked_by, unsent, approval = values[
            len(q.OPERATION_COLUMNS) :
        ]
        detail = detail or {}
        if "result" in detail:  # as `opened` does for a history's evidence
            result = open_result(self.payload_keys, op.id, detail["result"])
            if result is not detail["result"]:
                detail = {**detail, "result": result}
        pending = None if approval is None else PendingApproval.model_validate(approval)
        return Answer(
            operation=op,
            last_reason=last_reason,
            settled_detail=detail,
            open_review=None if review is None else Review.model_validate(review),
            blocked_by=tuple(Dependency.model_validate(d) for d in blocked_by or ()),
            unsent_why=unsent,
            awaiting_approval=pending,
        )

    def history(self, conn: Connection, op_id: str) -> History:
        """Everything recorded about `op_id`, read on `conn` (its transaction's view)."""
        row = conn.execute(q.SELECT_OPERATION, {"op_id": op_id}).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        params = {"op_id": op_id}
        return History(
            operation=operation(row),
            attempts=tuple(
                self.opened(record(Attempt, r)) for r in conn.execute(q.SELECT_ATTEMPTS, params)
            ),
            evidence=tuple(
                self.opened(record(Evidence, r)) for r in conn.execute(q.SELECT_EVIDENCE, params)
            ),
            transitions=tuple(
                record(Transition, r) for r in conn.execute(q.SELECT_TRANSITIONS, params)
            ),
            reviews=tuple(record(Review, r) for r in conn.execute(q.SELECT_REVIEWS, params)),
        )
