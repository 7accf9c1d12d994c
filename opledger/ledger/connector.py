"""The one door to the ledger's Postgres: engines, connections, URLs, errors, the hot path.

Every process reaches the ledger's database through here, and nowhere else:

- `ledger_engine(url)`: the SQLAlchemy engine (its pool) on a URL in any spelling
  `dsn.parse` reads, several hosts included; its connections use the ledger's schema,
  and one that finds its server read-only or going away is recycled;
- `dedicated(url)`: a connection of its own, outside any pool (the agents' LISTEN, the
  beat's advisory lock), made with libpq's own conninfo (`conninfo`: every host);
- `Connector`: the ledger's statements on an engine, each use translated as one unit: a
  transaction (ours, or the caller's session), an autocommit statement, a read-only
  snapshot, and the hot path (`Connector.hot_rows`: the worker's statements on psycopg
  directly, on connections kept for them);
- `translate(exc)`: the one translator of a database error, raised by SQLAlchemy or by
  psycopg, into the ledger's (`DatabaseUnavailable`, `SchemaMissing`, the guard's).

The SQL itself lives in `queries`; rows become records in `store`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy import Connection, Engine, TextClause, create_engine, event, text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import QueuePool

from . import dsn
from .errors import (
    DatabaseUnavailable,
    FenceWentBack,
    ForbiddenTransition,
    LedgerError,
    SchemaMissing,
)
from .pgschema import schema_from_environment, schema_of, search_path, use_schema

# -- errors -------------------------------------------------------------------------------

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
_TRANSIENT_FATAL = (
    "starting up",
    "shutting down",
    "too many",
    "recovery mode",
    "terminating",
    "not yet accepting connections",  # a standby being promoted, before it is consistent
)
#: undefined table, column or function: the schema is not (fully) migrated
_SCHEMA_STATES = frozenset({"42P01", "42703", "42883", "42704"})

#: what a server says when a connection to it is of no more use: it is read-only (a
#: standby, or a primary demoted to one: 25006), or shutting down, crashed or not yet
#: accepting connections (57P01, 57P02, 57P03); such a connection is closed, never reused
RECYCLE_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})


def _driver(exc: BaseException) -> tuple[BaseException | None, bool]:
    """The driver's error under `exc` (SQLAlchemy's wrapper or psycopg's own), and whether
    its connection was invalidated."""
    if isinstance(exc, DBAPIError):
        return exc.orig, exc.connection_invalidated
    return exc, False


def transient(exc: BaseException, *, invalidated: bool = False) -> bool:
    """Whether retrying later may succeed: the database was unreachable or restarting, or
    asked for a retry. A missing table, a refused login or a wrong database name is not.
    `exc` is SQLAlchemy's `DBAPIError` or psycopg's error."""
    orig, lost = _driver(exc)
    state = getattr(orig, "sqlstate", None)
    if state:
        return state.startswith("08") or state in _TRANSIENT_STATES
    if invalidated or lost:
        return True
    if isinstance(orig, psycopg.OperationalError):
        said = str(orig)
        if "FATAL:" in said:  # the server answered, and refused
            return any(reason in said for reason in _TRANSIENT_FATAL)
        return True  # refused, reset or timed out: the network or a restart
    return False


def translate(exc: BaseException, *, invalidated: bool = False) -> LedgerError | None:
    """The ledger error for a database error (SQLAlchemy's `DBAPIError` or psycopg's), or
    None when it is none of the ledger's."""
    orig, lost = _driver(exc)
    first_line = str(orig).splitlines()[0] if str(orig) else type(orig).__name__
    state = getattr(orig, "sqlstate", None) or ""
    kind = _TRIGGER_ERRORS.get(state)
    if kind is not None:
        return kind(first_line)
    if state in _SCHEMA_STATES:
        return SchemaMissing(
            f"the ledger's schema is missing or out of date ({first_line}): run `opledger migrate`"
        )
    if transient(exc, invalidated=invalidated or lost):
        return DatabaseUnavailable(f"the ledger's database is unavailable: {first_line}")
    return None


def raised(exc: BaseException, *, invalidated: bool = False, sql: str | None = None) -> Exception:
    """What to raise for a database error: the ledger's error for it, or, when it is none
    of the ledger's, SQLAlchemy's `DBAPIError` (`IntegrityError`, `ProgrammingError`...;
    a psycopg error met outside SQLAlchemy is wrapped as it would have been), so callers
    see one kind either way. Raise it `from frameless(exc)`."""
    mapped = translate(exc, invalidated=invalidated)
    if mapped is not None:
        return mapped
    if isinstance(exc, DBAPIError):
        return exc
    assert isinstance(exc, psycopg.Error)
    return DBAPIError.instance(sql, None, exc, psycopg.Error, connection_invalidated=invalidated)


def frameless(exc: BaseException) -> BaseException:
    """The driver's error under `exc`, kept as the cause of the ledger's error but without
    its stack frames or SQLAlchemy's wrapper: a ledger error says what went wrong in its own
    message, and the frames, the statement and its parameters (dozens of lines, payload
    values among them) would only bury it."""
    driver = getattr(exc, "orig", None) or exc
    driver.__suppress_context__ = True
    return driver.with_traceback(None)


def must_recycle(error: BaseException | None) -> bool:
    """Whether `error` (a psycopg error) says its connection is to be closed and another
    opened: `RECYCLE_STATES`. A new one lands where libpq's host list and
    `target_session_attrs` lead it (the promoted primary, with `read-write`)."""
    return getattr(error, "sqlstate", None) in RECYCLE_STATES


def recycle_read_only(context: ExceptionContext) -> None:
    """`handle_error`: an error of `RECYCLE_STATES` counts as a disconnect, so the pool
    invalidates the connection (and the pool's other connections, opened before it) and
    the next checkout opens a fresh one rather than reusing one on a read-only server."""
    if must_recycle(context.original_exception):
        context.is_disconnect = True


# -- URLs and connections -----------------------------------------------------------------


def sqlalchemy_url(url: str | URL) -> str:
    """A Postgres URL in any spelling `dsn.parse` reads (several hosts included) as the
    SQLAlchemy URL of the psycopg 3 driver, as a string (what alembic's configuration
    holds)."""
    return dsn.parse(url).sqlalchemy_url()


def conninfo(url: str | URL | Engine) -> str:
    """The libpq conninfo psycopg connects with (every host, port and parameter) for a URL
    in any spelling `dsn.parse` reads, an engine's, or a conninfo already (kept as it is)."""
    if isinstance(url, Engine):
        url = url.url
    if isinstance(url, str) and not dsn.is_postgres(url):
        return url  # `host=... port=...`: libpq's own terms already
    return dsn.parse(url).conninfo()


def dedicated(url: str | URL | Engine, *, timeout: float = 10) -> psycopg.Connection[Any]:
    """A connection of its own, in autocommit, outside any pool: for what lives as long as
    its connection (a LISTEN, an advisory lock). Every host of `url` is tried, as libpq
    does; psycopg's errors are raised as they are (its holder reconnects on them)."""
    return psycopg.connect(conninfo(url), autocommit=True, connect_timeout=max(1, int(timeout)))


def ledger_engine(url: str | URL, *, schema: str, **options: Any) -> Engine:
    """A SQLAlchemy engine on the ledger's database whose connections use `schema`.
    `url` is any spelling `dsn.parse` reads; a connection that finds its server
    read-only or shutting down is recycled (`recycle_read_only`)."""
    engine = create_engine(dsn.parse(url).sqlalchemy(), **options)
    event.listen(engine, "handle_error", recycle_read_only)
    use_schema(engine, schema)
    return engine


# -- the hot path -------------------------------------------------------------------------

_DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]
_COMPILED: dict[TextClause, str] = {}


def psycopg_sql(statement: TextClause) -> str:
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


def run(
    conn: psycopg.Connection[Any], statement: TextClause, params: Mapping[str, Any] | None = None
) -> psycopg.Cursor[Any]:
    """A `queries` statement on a psycopg connection (a dedicated one, or a kept one)."""
    return conn.execute(psycopg_sql(statement), params or {})


@dataclass(frozen=True)
class _Held:
    pooled: Any  #: the engine's wrapper, detached from its pool
    conn: psycopg.Connection[Any]  #: its psycopg connection
    pid: int  #: the process that opened it (the only one that may close it)


class _HotConnections:
    """Autocommit connections for `Connector.hot_rows`, taken and given back without reset.

    Made by the engine (its URL, connect arguments and `connect` events), then detached
    from its pool; sized as the engine's pool is: at most its size plus its overflow in
    use at once (a thread that finds them all taken waits for one, up to the pool's
    timeout), at most its size kept idle, so many threads of one process (agents sending
    inline) reuse a few connections instead of opening and closing one per statement. They
    are closed by `engine.dispose()`, or when the connector is garbage-collected. After a
    fork, `drop()` forgets the parent's without touching their sockets (closing them would
    end the parent's sessions).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        pool = engine.pool
        size = pool.size() if isinstance(pool, QueuePool) else 2
        overflow = int(getattr(pool, "_max_overflow", -1))
        self.keep = max(size, 2)
        #: at most this many at once; None: as many as asked for (a pool without a bound:
        #: an unlimited overflow, or no pool at all, as behind a pooler)
        self.limit: int | None = (
            max(self.keep, size + overflow)
            if isinstance(pool, QueuePool) and overflow >= 0
            else None
        )
        self.timeout = float(getattr(pool, "_timeout", 30.0))
        self._slots = _Slots(self.limit)
        self._pid = os.getpid()
        self._idle: deque[_Held] = deque()
        # `engine.dispose()` closes these too, as it closes the pool's (`_dispose_hot`); a
        # ledger that is dropped without being disposed still lets go of its connections
        # (the finalizer), as its pool does
        _watch(engine, self)
        weakref.finalize(self, _close_idle, self._idle)

    def take(self) -> _Held:
        if self._pid != os.getpid():  # a forked child: the parent's are not ours to use
            self.drop()
        if not self._slots.acquire(timeout=self.timeout):
            raise DatabaseUnavailable(
                f"no connection to the ledger free within {self.timeout:g} s: more threads "
                f"of this process run ledger statements at once than its pool allows "
                f"({self.limit}: Ledger.from_url(..., pool_size=N))"
            )
        try:
            return self._open()
        except BaseException:
            self._slots.release()
            raise

    def _open(self) -> _Held:
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
            self._slots.release()
        else:
            self.discard(held)

    def discard(self, held: _Held) -> None:
        _close_idle([held])
        self._slots.release()

    def drop(self) -> None:
        """Let go of every idle connection: closed if this process opened them, else (a
        forked child) kept alive and unused, never closed or collected here."""
        idle = list(self._idle)
        self._idle.clear()
        _close_idle(idle)
        if self._pid != os.getpid():  # a forked child: none of the parent's are in use here
            self._slots, self._pid = _Slots(self.limit), os.getpid()


class _Slots:
    """A semaphore of `limit` (None: no bound at all)."""

    def __init__(self, limit: int | None) -> None:
        self._semaphore = None if limit is None else threading.Semaphore(limit)

    def acquire(self, timeout: float) -> bool:
        return self._semaphore is None or self._semaphore.acquire(timeout=timeout)

    def release(self) -> None:
        if self._semaphore is not None:
            self._semaphore.release()


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


#: each engine's hot connections, held weakly: one `engine_disposed` listener per engine
#: drops them all. (A listener per connector, removed by its finalizer, could be removed
#: while SQLAlchemy was calling the engine's listeners: a garbage collection during
#: `engine.dispose()` then failed it with "deque mutated during iteration".)
_HOT: weakref.WeakKeyDictionary[Engine, weakref.WeakSet[_HotConnections]] = (
    weakref.WeakKeyDictionary()
)
_HOT_LOCK = threading.Lock()


def _watch(engine: Engine, hot: _HotConnections) -> None:
    with _HOT_LOCK:
        watched = _HOT.get(engine)
        if watched is None:
            watched = _HOT[engine] = weakref.WeakSet()
            event.listen(engine, "engine_disposed", _dispose_hot)
        watched.add(hot)


def _dispose_hot(engine: Engine) -> None:
    with _HOT_LOCK:
        watched = list(_HOT.get(engine, ()))
    for hot in watched:
        hot.drop()


#: connections a forked child inherited from its parent: never used, never closed
_INHERITED: list[_Held] = []

#: the caller's search_path, then another in its place until its transaction ends
_GET_PATH = text("SELECT current_setting('search_path')")
_SET_PATH = text("SELECT set_config('search_path', :path, true)")


class Connector:
    """The ledger's database on one engine: each use translated and committed as one unit.

    Thread-safe: each use checks a connection out of the engine's pool (or, for the hot
    path, takes one of the connections kept for it).
    """

    def __init__(self, engine: Engine, schema: str | None = None) -> None:
        """A connector on `engine`, in Postgres schema `schema` (default: the schema the
        engine already serves, else `OPLEDGER_DATABASE_SCHEMA`, else `opledger`); from now
        on every connection the engine opens runs with that schema as its whole
        `search_path`."""
        self.schema = schema or schema_of(engine) or schema_from_environment()
        use_schema(engine, self.schema)
        self.engine = engine
        self._auto = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._hot = _HotConnections(engine)

    def dispose(self) -> None:
        """Drop pooled connections (in a forked child; never share them across fork)."""
        self.engine.dispose(close=False)
        self._hot.drop()

    # -- through SQLAlchemy ----------------------------------------------------------------

    @contextmanager
    def transaction(self, session: Session | None = None) -> Iterator[Connection]:
        """One transaction: the caller's (via `session`) or our own, committed on exit.

        The caller's connection is its own, with its own `search_path`: for our statements
        it is the ledger's schema (local to the transaction), then the caller's again, as
        it was, before the caller's code runs on."""
        with self.translated():
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
        with self.translated(), self._auto.connect() as conn:
            yield conn

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A read-only transaction that sees one consistent state of the database."""
        with self.translated(), self.engine.connect() as conn, conn.begin():
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn

    @contextmanager
    def translated(self) -> Iterator[None]:
        """Database errors raised inside become the ledger's (`translate`)."""
        try:
            yield
        except DBAPIError as exc:
            mapped = translate(exc)
            if mapped is None:
                raise
            raise mapped from frameless(exc)

    # -- the hot path ----------------------------------------------------------------------

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
        wake), so they skip SQLAlchemy's per-execution work (result metadata, events,
        execution contexts, the pool's reset on return): a connection kept for them alone,
        in autocommit, runs the statement (one round trip, one synchronously committed
        transaction) as a server-side prepared statement that connection keeps, and only
        the row's values come back. Errors are translated as everywhere else; a
        connection an error broke is closed.
        """
        sql = psycopg_sql(statement)
        try:
            held = self._hot.take()
        # no connection to be had (refused, restarting, a standby not yet promoted): the
        # engine's connect raises SQLAlchemy's error, a kept connection psycopg's
        except (psycopg.Error, DBAPIError) as exc:
            raise raised(exc) from frameless(exc)
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
            raise raised(exc, invalidated=broken, sql=sql) from frameless(exc)
        except BaseException:
            self._hot.discard(held)  # interrupted mid-statement: its state is unknown
            raise
        self._hot.give(held)
        return rows


__all__ = [
    "RECYCLE_STATES",
    "Connector",
    "compact",
    "conninfo",
    "dedicated",
    "frameless",
    "ledger_engine",
    "must_recycle",
    "psycopg_sql",
    "raised",
    "recycle_read_only",
    "run",
    "sqlalchemy_url",
    "transient",
    "translate",
]
