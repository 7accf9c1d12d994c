"""The ledger's Postgres edge: connections, transactions, error translation, row mapping.

`Ledger` and `Reviews` reach the database only through a `Store`, so a database error
becomes a ledger error in one place, and a row becomes a record in one place. The SQL
itself lives in `queries`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from pydantic import BaseModel
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session

from . import queries as q
from .errors import (
    DatabaseUnavailable,
    FenceWentBack,
    ForbiddenTransition,
    LedgerError,
    OperationNotFound,
    SchemaMissing,
)
from .models import Attempt, Authorization, Evidence, History, Operation, Review, Transition

R = TypeVar("R", bound=BaseModel)

#: the guard trigger's error codes (migrations 0001 and 0006), as ledger errors
_TRIGGER_ERRORS: dict[str, type[LedgerError]] = {
    "OL001": ForbiddenTransition,  # a status change the state machine does not allow
    "OL002": FenceWentBack,  # a fence that would decrease
    "OL003": ForbiddenTransition,  # a status change that does not say who and why
}


#: server errors that say "try again": serialization failure, deadlock, shutting down or
#: starting up, too many connections (class 08, connection exceptions, counts too)
_TRANSIENT_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300"})
#: what a server that refuses a connection says when it is only restarting or busy
_TRANSIENT_FATAL = ("starting up", "shutting down", "too many", "recovery mode", "terminating")
#: undefined table, column or function: the schema is not (fully) migrated
_SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "42704"})


def transient(exc: DBAPIError) -> bool:
    """Whether retrying later may succeed: the database was unreachable or restarting, or
    asked for a retry. A missing table, a refused login or a wrong database name is not."""
    state = getattr(exc.orig, "sqlstate", None)
    if state:
        return state.startswith("08") or state in _TRANSIENT_STATES
    if exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError):
        said = str(exc.orig)
        if "FATAL:" in said:  # the server answered, and refused
            return any(reason in said for reason in _TRANSIENT_FATAL)
        return True  # refused, reset or timed out: the network or a restart
    return False


def translate(exc: DBAPIError) -> LedgerError | None:
    """The ledger error for a database error, or None when it is none of the ledger's."""
    first_line = str(exc.orig).splitlines()[0] if str(exc.orig) else type(exc.orig).__name__
    state = getattr(exc.orig, "sqlstate", None) or ""
    kind = _TRIGGER_ERRORS.get(state)
    if kind is not None:
        return kind(first_line)
    if state in _SCHEMA_STATES:
        return SchemaMissing(
            f"the ledger's schema is missing or out of date ({first_line}): run `opledger migrate`"
        )
    if transient(exc):
        return DatabaseUnavailable(f"the ledger's database is unavailable: {first_line}")
    return None


def record(model: type[R], row: Any) -> R:
    """The record `model` built from the row's columns of the same names."""
    m = row._mapping
    return model.model_validate({name: m[name] for name in model.model_fields})


def operation(row: Any) -> Operation:
    return record(Operation, row)


def authorization(row: Any) -> Authorization:
    m = dict(row._mapping)
    m["scope"] = tuple(m["scope"])
    return Authorization.model_validate({name: m[name] for name in Authorization.model_fields})


class Store:
    """Connections to the ledger's database, each use translated and committed as one unit.

    Thread-safe: each use checks a connection out of the engine's pool.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        """Drop pooled connections (in a forked child; never share them across fork)."""
        self.engine.dispose(close=False)

    @contextmanager
    def transaction(self, session: Session | None = None) -> Iterator[Connection]:
        """One transaction: the caller's (via `session`) or our own, committed on exit."""
        with self._translated():
            if session is not None:
                yield session.connection()
            else:
                with self.engine.begin() as conn:
                    yield conn

    @contextmanager
    def statement(self) -> Iterator[Connection]:
        """An autocommit connection: each statement is its own transaction, one round trip."""
        with self._translated(), self._auto.connect() as conn:
            yield conn

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A read-only transaction that sees one consistent state of the database."""
        with self._translated(), self.engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except DBAPIError as exc:
            mapped = translate(exc)
            if mapped is None:
                raise
            raise mapped from exc

    # -- reads shared by the ledger and the review queue -----------------------------------

    def history(self, conn: Connection, op_id: str) -> History:
        """Everything recorded about `op_id`, read on `conn` (its transaction's view)."""
        row = conn.execute(q.SELECT_OPERATION, {"op_id": op_id}).one_or_none()
        if row is None:
            raise OperationNotFound(f"no operation {op_id}", op_id=op_id)
        params = {"op_id": op_id}
        return History(
            operation=operation(row),
            attempts=tuple(record(Attempt, r) for r in conn.execute(q.SELECT_ATTEMPTS, params)),
            evidence=tuple(record(Evidence, r) for r in conn.execute(q.SELECT_EVIDENCE, params)),
            transitions=tuple(
                record(Transition, r) for r in conn.execute(q.SELECT_TRANSITIONS, params)
            ),
            reviews=tuple(record(Review, r) for r in conn.execute(q.SELECT_REVIEWS, params)),
        )
