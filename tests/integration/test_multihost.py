"""A primary and its standby in one URL, against the real Postgres: every spelling of a
multi-host URL takes every process past a dead first host (127.0.0.1:1) to the live one
(the library, `opledger migrate` and `opledger check`, the beat's lock, the agents'
LISTEN connection), and a connection whose server turns out read-only is recycled, never
used again.

There is one server here, so "the standby" is a connection made read-only in a `connect`
event, which answers a write as a standby does (SQLSTATE 25006), and "a restart" is
`pg_terminate_backend` (57P01).
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

from opledger.agents import Effects
from opledger.agents.listener import CHANNEL, listener_for
from opledger.ledger import DatabaseUnavailable, Ledger, Status, dsn
from opledger.ledger.connector import ledger_engine
from opledger.ledger.pgschema import beat_lock_key, lock_words
from opledger.tasks.beat import BeatLock, BeatLockTaken
from tests.clirun import cli, side_by_side
from tests.conftest import SCHEMA, PostgresServer, libpq
from tests.intents import intent, prepare, settle

DEAD = ("127.0.0.1", 1)  # nothing listens there: refused at once
#: the password is not checked (trust), but every URL carries one, so what is shown can be
#: checked for it
PASSWORD = "n0t-Sh0wn/ever"
PW = "n0t-Sh0wn%2Fever"


def spellings(live_url: str, *, dead_first: bool = True) -> dict[str, str]:
    """The session's database as each multi-host spelling names it, behind (or before) a
    dead host, with `target_session_attrs=read-write` and an application name of its own."""
    live = dsn.parse(live_url)
    (host,), (port,) = live.hosts, live.ports
    port = port or 5432
    servers = [DEAD, (host, port)] if dead_first else [(host, port), DEAD]
    user, db = live.user or "postgres", live.database
    tag = uuid.uuid4().hex[:6]
    params = f"target_session_attrs=read-write&connect_timeout=5&application_name=multihost-{tag}"
    netloc = ",".join(f"{h}:{p}" for h, p in servers)
    repeated = "&".join(f"host={h}:{p}" for h, p in servers)
    hosts = ",".join(h for h, _ in servers)
    ports = ",".join(str(p) for _, p in servers)
    return {
        "netloc": f"postgresql://{user}:{PW}@{netloc}/{db}?{params}-1",
        "netloc, postgres+psycopg2": f"postgresql+psycopg2://{user}:{PW}@{netloc}/{db}?{params}-2",
        "repeated host": f"postgresql://{user}:{PW}@/{db}?{repeated}&{params}-3",
        "host and port lists": (
            f"postgres://{user}:{PW}@/{db}?host={hosts}&port={ports}&{params}-4"
        ),
    }


@pytest.mark.parametrize("dead_first", [True, False], ids=["dead first", "dead last"])
def test_the_library_reaches_the_live_host_in_every_spelling(
    ledger: Ledger, database_url: str, dead_first: bool
) -> None:
    for name, url in spellings(database_url, dead_first=dead_first).items():
        other = Ledger.from_url(url, pool_size=1, schema=SCHEMA)
        try:
            other.grant(tenant="acme", scope=["crm.*"], granted_by="test", ref=f"auth_{name}")
            op = prepare(other, f"multihost-{name}", authorization_ref=f"auth_{name}")
            # ground truth: the row, read through the session's own single-host ledger
            assert ledger.get(op).intent_key == f"multihost-{name}", name
            with other.engine.connect() as conn:
                port = conn.exec_driver_sql("SHOW port").scalar_one()
            assert port == "5432", name
        finally:
            other.engine.dispose()


def test_migrate_and_check_pass_past_a_dead_first_host(
    pg_server: PostgresServer, database_url: str, redis_server: str
) -> None:
    fresh = pg_server.create_database("opledger_multihost")
    try:
        urls = spellings(fresh)
        first, *others = urls.values()
        migrated = cli(first, "migrate")  # an empty database: the whole schema is made
        assert migrated.code == 0, migrated.err
        beat = Ledger.from_url(first, schema=SCHEMA)
        try:  # a beat ticked (`check` fails without one)
            beat.beat_heartbeat(host="beat-host", pid=1, started_at=datetime.now(UTC))
        finally:
            beat.engine.dispose()
        # the others find it migrated; `check` reaches Postgres, the schema and the lock
        broker = f"{redis_server}/5"
        runs = side_by_side(
            *(functools.partial(cli, u, "migrate") for u in others),
            *(
                functools.partial(cli, u, "check", OPLEDGER_BROKER_URL=broker)
                for u in urls.values()
            ),
        )
        for run in runs:
            assert run.code == 0, (run.out, run.err)
            assert PASSWORD not in run.out + run.err and PW not in run.out + run.err
        for checked in runs[len(others) :]:
            for line in ("ok   postgres", "ok   schema", "ok   beat lock", "ok   beat"):
                assert line in checked.out, checked.out
        # ground truth: the ledger's tables in the fresh database, at the latest migration
        with psycopg.connect(libpq(fresh)) as conn:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = %s", [SCHEMA]
            ).fetchone()
            version = conn.execute(f'SELECT version_num FROM "{SCHEMA}".alembic_version')
            assert version.fetchone() is not None
        assert tables is not None and tables[0] > 5
    finally:
        pg_server.drop_database(fresh)


def test_a_bad_url_is_one_line_and_exit_4_without_the_password(database_url: str) -> None:
    url = f"postgresql://postgres:{PW}@127.0.0.1:1,127.0.0.1:54x2/db"
    for command in ("migrate", "check"):
        run = cli(url, command)
        assert run.code == 4, (run.out, run.err)
        said = run.out + run.err
        assert "port 2 is not a number from 1 to 65535" in said, said
        assert PASSWORD not in said and PW not in said and "Sh0wn" not in said
        assert "Traceback" not in said


def lock_holder(database_url: str, schema: str = SCHEMA) -> int | None:
    """The backend holding the beat's advisory lock of `schema`, from pg_locks."""
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %(hi)s AND objid = %(lo)s AND objsubid = 1"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            lock_words(beat_lock_key(schema)),
        ).fetchone()
    return None if row is None else int(row[0])


def terminate(database_url: str, pid: int) -> None:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", [pid])


def wait_for(condition: Callable[[], bool], seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)


@pytest.mark.parametrize("dead_first", [True, False], ids=["dead first", "dead last"])
def test_the_beat_lock_is_taken_through_every_spelling(database_url: str, dead_first: bool) -> None:
    for name, url in spellings(database_url, dead_first=dead_first).items():
        assert lock_holder(database_url) is None, name
        lock = BeatLock(url, schema=SCHEMA, check_every=0.1)
        try:
            holder = lock_holder(database_url)
            assert holder is not None, name
            # the same lock a beat given the plain URL would need
            with pytest.raises(BeatLockTaken):
                BeatLock(database_url, schema=SCHEMA).release()
            # its server restarts (57P01 on its connection): the lock is taken again on a
            # new connection, through the same host list
            terminate(database_url, holder)
            wait_for(functools.partial(held_by_another, database_url, holder))
        finally:
            lock.release()
        wait_for(lambda: lock_holder(database_url) is None)


def held_by_another(database_url: str, pid: int) -> bool:
    return lock_holder(database_url) not in (None, pid)


@pytest.fixture
def stopped_listeners() -> Iterator[list[str]]:
    dsns: list[str] = []
    yield dsns
    for conninfo in dsns:
        listener_for(conninfo).stop()


def listening_pid(database_url: str, application_name: str) -> int | None:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND query = %s",
            [application_name, f"LISTEN {CHANNEL}"],
        ).fetchone()
    return None if row is None else int(row[0])


def listening_anew(database_url: str, application_name: str, pid: int) -> bool:
    return listening_pid(database_url, application_name) not in (None, pid)


@pytest.mark.parametrize("dead_first", [True, False], ids=["dead first", "dead last"])
def test_the_agents_listen_connection_hears_a_settle_through_every_spelling(
    ledger: Ledger, grant: str, database_url: str, dead_first: bool, stopped_listeners: list[str]
) -> None:
    cases: list[tuple[str, str, Callable[[], Ledger]]] = [
        (name, url, functools.partial(Ledger.from_url, url, pool_size=1, schema=SCHEMA))
        for name, url in spellings(database_url, dead_first=dead_first).items()
    ]
    # an engine of the application's own, in SQLAlchemy's spellings (`Ledger(engine)`):
    # the listener connects wherever its URL says, every host included
    for name, url in spellings(database_url, dead_first=dead_first).items():
        if name in ("repeated host", "host and port lists"):
            cases.append((f"own engine, {name}", url, functools.partial(own_engine, url)))
    for name, url, make in cases:
        agents = make()
        try:
            effects = Effects(agents, publish=lambda _op_id: None, poll=60.0)
            stopped_listeners.append(effects._dsn)
            hear_settles(ledger, database_url, effects._dsn, url, name)
        finally:
            agents.engine.dispose()


def own_engine(url: str) -> Ledger:
    """A ledger on an engine the application made itself from `url` (SQLAlchemy's own
    reading of it, with the psycopg driver)."""
    engine = create_engine("postgresql+psycopg://" + url.split("://", 1)[1], pool_size=1)
    return Ledger(engine, schema=SCHEMA)


def hear_settles(ledger: Ledger, database_url: str, conninfo: str, url: str, name: str) -> None:
    """The listener of `conninfo` hears a settle, loses its connection (57P01), listens
    again on a new one and hears the next."""
    listener = listener_for(conninfo)
    listener.watch(set()).close()  # starts it
    wait_for(lambda: listener.listening)
    application = dict(dsn.parse(url).params)["application_name"]
    for round_ in ("first", "after a restart"):
        op = ledger.prepare(**intent(f"listen-{name}-{round_}"), notify=True).id  # a waited one
        waiter = listener.watch({op})
        try:
            assert waiter.heard, (name, round_)  # listening when it registered
            settle(ledger, op)
            assert waiter.wait(20), (name, round_)  # woken by the NOTIFY
        finally:
            waiter.close()
        pid = listening_pid(database_url, application)
        assert pid is not None, name  # on the live server, under its own name
        if round_ == "first":  # the server goes away under it (57P01)
            terminate(database_url, pid)
            wait_for(functools.partial(listening_anew, database_url, application, pid))
            wait_for(lambda: listener.listening)


# -- a connection on a read-only server ---------------------------------------------------


class Standby:
    """While `on`, every connection `engine` opens answers like a standby (each of its
    transactions read-only: a write is refused with 25006), as the server a connection
    reached before a promotion would; `opened` lists the backends, `read_only` those."""

    def __init__(self, engine: Engine) -> None:
        self.on = True
        self.opened: list[int] = []
        self.read_only: list[int] = []
        event.listen(engine, "connect", self._connect)

    def _connect(self, dbapi_connection: Any, _record: Any) -> None:
        pid = dbapi_connection.info.backend_pid
        self.opened.append(pid)
        if self.on:
            self.read_only.append(pid)
            autocommit = dbapi_connection.autocommit
            dbapi_connection.autocommit = True
            dbapi_connection.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_connection.autocommit = autocommit


def backends_alive(database_url: str, pids: list[int]) -> int:
    with psycopg.connect(libpq(database_url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", [pids])
        found = row.fetchone()
    return int(found[0]) if found else 0


@pytest.mark.parametrize("multihost", [False, True], ids=["one host", "dead host first"])
def test_a_pooled_connection_that_meets_a_read_only_server_is_invalidated(
    database_url: str, multihost: bool
) -> None:
    url = spellings(database_url)["netloc"] if multihost else database_url
    engine = ledger_engine(url, schema=SCHEMA, pool_size=1, max_overflow=0)
    standby = Standby(engine)
    try:
        with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
            conn.execute(text("CREATE TEMP TABLE standby_probe (x int)"))
        assert getattr(caught.value.orig, "sqlstate", None) == "25006"
        assert caught.value.connection_invalidated  # counted as a disconnect
        # the read-only connection is closed, not back in the pool
        wait_for(lambda: backends_alive(database_url, standby.read_only) == 0, 10)
        standby.on = False  # the host list now leads to the primary
        with engine.begin() as conn:  # the next checkout is a fresh connection
            conn.execute(text("CREATE TEMP TABLE standby_probe (x int)"))
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            read_only = conn.exec_driver_sql("SHOW transaction_read_only").scalar_one()
        assert pid not in standby.read_only and pid == standby.opened[-1]
        assert read_only == "off"
    finally:
        engine.dispose()


@pytest.mark.parametrize("call", ["grant", "claim"])
def test_a_ledger_on_a_read_only_server_is_unavailable_then_writes_on_a_fresh_connection(
    ledger: Ledger, grant: str, database_url: str, call: str
) -> None:
    """Through the ledger's own calls (a grant on the engine's pool, a claim on the
    connections the store keeps for it): the write that meets the read-only server is
    `DatabaseUnavailable` (retryable, as a worker's task retries it), and once the host
    list leads elsewhere the same ledger writes, never failing on that connection again."""
    op = prepare(ledger, "read-only-claim")
    engine = ledger_engine(database_url, schema=SCHEMA, pool_size=1, max_overflow=0)
    standby = Standby(engine)
    other = Ledger(engine, schema=SCHEMA)

    def write() -> object:
        if call == "grant":
            return other.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_ro")
        return other.claim(op, owner="w-read-only")

    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            write()
        assert "read-only transaction" in str(caught.value)
        wait_for(lambda: backends_alive(database_url, standby.read_only) == 0, 10)
        standby.on = False
        assert write() is not None
        # ground truth, read through the session's own ledger
        if call == "grant":
            assert ledger.authorization("auth_ro").ref == "auth_ro"
        else:
            assert ledger.get(op).status == Status.DISPATCHING
    finally:
        engine.dispose()
