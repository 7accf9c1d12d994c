"""The ledger's Postgres edge: connections, transactions, error translation, row mapping.

`Ledger` and `Reviews` reach the database only through a `Store`, so a database error
becomes a ledger error in one place, and a row becomes a record in one place. The SQL
itself lives in `queries`.
"""

from __future__ import annotations

import contextlib
import json
import os
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from pydantic import BaseModel
from sqlalchemy import Connection, Engine, TextClause, event, text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from . import queries as q
from .epochs import Witness
from .errors import (
    DatabaseUnavailable,
    FenceWentBack,
    ForbiddenTransition,
    LedgerError,
    OperationNotFound,
    SchemaMissing,
)
from .models import (
    Answer,
    Attempt,
    Authorization,
    Dependency,
    Evidence,
    History,
    Operation,
    Review,
    Transition,
)
from .payload_keys import PayloadKeys, open_result, payload_text
from .pgschema import must_recycle, schema_from_environment, schema_of, search_path, use_schema

R = TypeVar("R", bound=BaseModel)
F = TypeVar("F", Attempt, Evidence)

#: the caller's search_path, then another in its place until its transaction ends
_GET_PATH = text("SELECT current_setting('search_path')")
_SET_PATH = text("SELECT set_config('search_path', :path, true)")

#: the guard trigger's error codes (`opledger_guard_operation` in schema.sql), as ledger errors
_TRIGGER_ERRORS: dict[str, type[LedgerError]] = {
    "OL001": ForbiddenTransition,  # a status change the state machine does not allow
    "OL002": FenceWentBack,  # a fence that would decrease
    "OL003": ForbiddenTransition,  # a status change that does not say who and why
}


#: server errors that say "try again": serialization failure, deadlock, shutting down or
#: starting up, too many connections (class 08, connection exceptions, counts too)
#: a read-only server (25006: a standby, or a primary demoted under us) counts too: the
#: connection is dropped and the next one finds the primary (a multi-host URL with
#: target_session_attrs=read-write)
_TRANSIENT_STATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03", "53300", "25006"})
#: what a server that refuses a connection says when it is only restarting or busy
_TRANSIENT_FATAL = ("starting up", "shutting down", "too many", "recovery mode", "terminating")
#: undefined table, column or function: the schema is not (fully) migrated
_SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "42704"})


def to_json(value: Any) -> str:
    """A value as the ledger writes it into a jsonb column: compact, keys sorted (so the
    same facts are the same text), anything else as its string."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)


def transient(exc: DBAPIError) -> bool:
    """Whether retrying later may succeed: the database was unreachable or restarting, or
    asked for a retry. A missing table, a refused login or a wrong database name is not."""
    return _transient(exc.orig, invalidated=exc.connection_invalidated)


def _transient(orig: BaseException | None, *, invalidated: bool) -> bool:
    state = getattr(orig, "sqlstate", None)
    if state:
        return state.startswith("08") or state in _TRANSIENT_STATES
    if invalidated:
        return True
    if isinstance(orig, psycopg.OperationalError):
        said = str(orig)
        if "FATAL:" in said:  # the server answered, and refused
            return any(reason in said for reason in _TRANSIENT_FATAL)
        return True  # refused, reset or timed out: the network or a restart
    return False


def translate(exc: DBAPIError) -> LedgerError | None:
    """The ledger error for a database error, or None when it is none of the ledger's."""
    return _translate(exc.orig, invalidated=exc.connection_invalidated)


def _translate(orig: BaseException | None, *, invalidated: bool) -> LedgerError | None:
    first_line = str(orig).splitlines()[0] if str(orig) else type(orig).__name__
    state = getattr(orig, "sqlstate", None) or ""
    kind = _TRIGGER_ERRORS.get(state)
    if kind is not None:
        return kind(first_line)
    if state in _SCHEMA_STATES:
        return SchemaMissing(
            f"the ledger's schema is missing or out of date ({first_line}): run `opledger migrate`"
        )
    if _transient(orig, invalidated=invalidated):
        return DatabaseUnavailable(f"the ledger's database is unavailable: {first_line}")
    return None


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


def _frameless(exc: BaseException) -> BaseException:
    """The driver's error under `exc`, kept as the cause of the ledger's error but without
    its stack frames or SQLAlchemy's wrapper: a ledger error says what went wrong in its own
    message, and the frames, the statement and its parameters (dozens of lines, payload
    values among them) would only bury it."""
    driver = getattr(exc, "orig", None) or exc
    driver.__suppress_context__ = True
    return driver.with_traceback(None)


def _driver_error(exc: psycopg.Error, *, invalidated: bool, sql: str | None = None) -> Exception:
    """What to raise for a psycopg error met outside SQLAlchemy: the ledger's error for it,
    or, when it is none of the ledger's, the `DBAPIError` SQLAlchemy would have raised
    (`IntegrityError`, `ProgrammingError`...), so callers see one kind either way."""
    mapped = _translate(exc, invalidated=invalidated)
    if mapped is not None:
        return mapped
    return DBAPIError.instance(sql, None, exc, psycopg.Error, connection_invalidated=invalidated)


_DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]
_COMPILED: dict[TextClause, str] = {}


def _psycopg_sql(statement: TextClause) -> str:
    """A `queries` statement as psycopg takes it (`%(name)s` placeholders), compiled once,
    without its indentation and comment lines (`compact`)."""
    sql = _COMPILED.get(statement)
    if sql is None:
        sql = _COMPILED[statement] = compact(str(statement.compile(dialect=_DIALECT)))
    return sql


def compact(sql: str) -> str:
    """`sql` without indentation, blank lines and whole-line `--` comments: the same
    statement, shorter. psycopg converts a statement's placeholders once and caches the
    result only for statements of at most 4 KiB; a longer one is parsed again on every
    execution (the claim, written out with its comments, is 4.6 KiB)."""
    lines = (line.strip() for line in sql.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


@dataclass(frozen=True)
class _Held:
    pooled: Any  #: the engine's wrapper, detached from its pool
    conn: psycopg.Connection[Any]  #: its psycopg connection
    pid: int  #: the process that opened it (the only one that may close it)


class _HotConnections:
    """Autocommit connections for `Store.hot`, taken and given back without any reset.

    Made by the engine (its URL, connect arguments and `connect` events), then detached
    from its pool; as many as run hot statements at once, at most `keep` kept idle. They
    are closed by `engine.dispose()`, or when the store is garbage-collected. After a
    fork, `drop()` forgets the parent's without touching their sockets (closing them would
    end the parent's sessions).
    """

    def __init__(self, engine: Engine, keep: int = 2) -> None:
        self.engine = engine
        self.keep = keep
        self._idle: deque[_Held] = deque()
        # `engine.dispose()` closes these too, as it closes the pool's. The listener holds
        # this object weakly, and goes when it goes: a ledger that is dropped without being
        # disposed still lets go of its connections (the finalizer), as its pool does.
        this = weakref.ref(self)

        def disposed(_engine: Engine) -> None:
            hot = this()
            if hot is not None:
                hot.drop()

        event.listen(engine, "engine_disposed", disposed)
        weakref.finalize(self, _finalize, self._idle, engine, disposed)

    def take(self) -> _Held:
        while self._idle:
            try:
                held = self._idle.pop()
            except IndexError:  # another thread took the last one
                break
            if held.pid == os.getpid():
                return held
            _close_idle([held])  # a parent's (forked without `dispose()`): kept, unused
        pooled = self.engine.raw_connection()
        conn = pooled.driver_connection
        pooled.detach()  # ours now: closing `pooled` closes `conn`
        assert conn is not None
        conn.autocommit = True
        # Each hot statement is prepared once per connection; Postgres would plan the
        # answers' statement (an array of ids) afresh on every execution, choosing a
        # custom plan each time (0.35 ms of planning per read); the claim and the outcome
        # get the generic plan from their sixth execution anyway.
        conn.execute("SET plan_cache_mode = force_generic_plan")
        return _Held(pooled, conn, os.getpid())

    def give(self, held: _Held) -> None:
        if len(self._idle) < self.keep and held.pid == os.getpid():
            self._idle.append(held)
        else:
            self.discard(held)

    def discard(self, held: _Held) -> None:
        _close_idle([held])

    def drop(self) -> None:
        """Let go of every idle connection: closed if this process opened them, else (a
        forked child) kept alive and unused, never closed or collected here."""
        idle = list(self._idle)
        self._idle.clear()
        _close_idle(idle)


def _close_idle(idle: Iterable[_Held]) -> None:
    """Close the connections this process opened; keep a parent's alive and unused.

    Closed on psycopg directly: the engine's wrapper would first send a ROLLBACK, which a
    broken or interrupted connection cannot take (and would then log an error and leave
    the socket open)."""
    for held in list(idle):
        if held.pid != os.getpid():
            _INHERITED.append(held)
            continue
        with contextlib.suppress(Exception):
            held.conn.close()


def _finalize(idle: Iterable[_Held], engine: Engine, listener: Any) -> None:
    _close_idle(idle)
    with contextlib.suppress(Exception):
        event.remove(engine, "engine_disposed", listener)


#: connections a forked child inherited from its parent: never used, never closed
_INHERITED: list[_Held] = []


class Store:
    """Connections to the ledger's database, each use translated and committed as one unit.

    Thread-safe: each use checks a connection out of the engine's pool.
    """

    def __init__(
        self, engine: Engine, schema: str | None = None, payload_keys: PayloadKeys | None = None
    ) -> None:
        """A store on `engine`, in Postgres schema `schema` (default: the schema the engine
        already serves, else `OPLEDGER_DATABASE_SCHEMA`, else `opledger`); from now on every
        connection the engine opens runs with that schema as its whole `search_path`.
        `payload_keys` seal the frozen payloads it writes and open those it reads (none:
        written in clear, and only clear ones read)."""
        self.schema = schema or schema_of(engine) or schema_from_environment()
        self.payload_keys = payload_keys
        use_schema(engine, self.schema)
        self.engine = engine
        self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._hot = _HotConnections(engine)
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

    def hot(self, statement: TextClause, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The first row `hot_rows` gives, or None."""
        rows = self.hot_rows(statement, params, first=True)
        return rows[0] if rows else None

    def hot_rows(
        self, statement: TextClause, params: Mapping[str, Any], *, first: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run one of the hot statements and return its rows (tuples; only the first with
        `first`).

        The claim and the outcome run once per operation (and an agent's answer once per
        wake), so they skip SQLAlchemy's
        per-execution work (result metadata, events, execution contexts, the pool's reset
        on return): a connection kept for them alone, in autocommit, runs the statement
        (one round trip, one synchronously committed transaction) as a server-side
        prepared statement that connection keeps, and only the row's values come back.
        Errors are translated as everywhere else; a connection an error broke is closed.
        """
        sql = _psycopg_sql(statement)
        try:
            held = self._hot.take()
        except psycopg.Error as exc:  # no connection to be had (refused, restarting...)
            raise _driver_error(exc, invalidated=False) from _frameless(exc)
        conn = held.conn
        try:
            cursor = conn.execute(sql, params, prepare=True)
            if first:
                row = cursor.fetchone()
                rows: list[tuple[Any, ...]] = [] if row is None else [row]
            else:
                rows = cursor.fetchall()
        except psycopg.Error as exc:
            # a server that is read-only (a standby) or going away keeps nothing for us:
            # the connection goes, and the next one is made anew (on the new primary)
            broken = conn.broken or conn.closed or must_recycle(exc)
            if broken:
                self._hot.discard(held)
            else:
                self._hot.give(held)
            raise _driver_error(exc, invalidated=broken, sql=sql) from _frameless(exc)
        except BaseException:
            self._hot.discard(held)  # interrupted mid-statement: its state is unknown
            raise
        self._hot.give(held)
        return rows

    def dispose(self) -> None:
        """Drop pooled connections (in a forked child; never share them across fork)."""
        self.engine.dispose(close=False)
        self._hot.drop()

    @contextmanager
    def transaction(self, session: Session | None = None) -> Iterator[Connection]:
        """One transaction: the caller's (via `session`) or our own, committed on exit.

        The caller's connection is its own, with its own `search_path`: for our statements
        it is the ledger's schema (local to the transaction), then the caller's again, as
        it was, before the caller's code runs on."""
        with self._translated():
            if session is not None:
                with self._in_schema(session.connection()) as conn:
                    yield conn
            else:
                with self.engine.begin() as conn:
                    yield conn

    @contextmanager
    def _in_schema(self, conn: Connection) -> Iterator[Connection]:
        previous = conn.execute(_GET_PATH).scalar_one()
        conn.execute(_SET_PATH, {"path": search_path(self.schema)})
        failed = True
        try:
            yield conn
            failed = False
        finally:
            try:
                conn.execute(_SET_PATH, {"path": previous})
            except DBAPIError:
                if not failed:  # a failed statement aborted the transaction: it rolls back
                    raise

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
            raise mapped from _frameless(exc)

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
        last_reason, detail, review, blocked_by = values[len(q.OPERATION_COLUMNS) :]
        detail = detail or {}
        if "result" in detail:  # as `opened` does for a history's evidence
            result = open_result(self.payload_keys, op.id, detail["result"])
            if result is not detail["result"]:
                detail = {**detail, "result": result}
        return Answer(
            operation=op,
            last_reason=last_reason,
            settled_detail=detail,
            open_review=None if review is None else Review.model_validate(review),
            blocked_by=tuple(Dependency.model_validate(d) for d in blocked_by or ()),
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
