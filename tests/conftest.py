"""Shared fixtures: a real Postgres database for the ledger, migrated once per session.

The server is the one `opledger.dev.devstack` finds: OPLEDGER_DATABASE_URL, the local server on
127.0.0.1:5432, or an embedded Postgres started from the dev extra. Each test session gets
its own database, and each test starts from empty tables.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from sqlalchemy.engine import make_url

from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger
from opledger.ledger.migrate import ledger_tables, upgrade
from opledger.ledger.pgschema import SCHEMA_VARIABLE
from tests import reaper, stacks
from tests.cpuprofile import pytest_runtest_protocol  # noqa: F401 - OPLEDGER_TEST_CPU

#: The suite runs the ledger in a schema that is not the default one (`opledger`), so a
#: statement or a process that forgets the setting fails here instead of in a user's
#: database; every process the tests start inherits it. `OPLEDGER_DATABASE_SCHEMA=opledger
#: make test` runs it on the default. The demo's own runs use their own settings.
SCHEMA = os.environ.setdefault(SCHEMA_VARIABLE, "acme_ledger")

# `make mutate` runs the unit tests against each mutant with this profile: the same examples
# every run (so the kill rate is reproducible) and no deadline (mutmut's trampolines make
# every call slower, and a missed deadline must not count as a kill).
settings.register_profile("mutmut", deadline=None, derandomize=True)
# Every other run: no per-example deadline either. The suite shares two cores between two
# pytest processes and the system tests' workers; a stalled example is not a failure.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure(config: pytest.Config) -> None:
    """Every process this pytest process starts ends with it, however it ends (SIGTERM,
    SIGKILL, a crash: `tests.reaper`)."""
    reaper.install()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """No system stack runs under a test that is not a system test (`tests.stacks`)."""
    if not item.get_closest_marker("system"):
        stacks.stop_all()


def require_rabbitmq() -> None:
    """Skip the test when the machine's RabbitMQ cannot give it a private virtual host: a
    skip on a laptop, a failure in CI (where `.ci/run` starts RabbitMQ)."""
    from opledger.dev.processes import rabbitmq_available

    why = rabbitmq_available()
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """For `pytest -n 4 --dist loadscope --no-loadscope-reorder` (`make test`): each test file
    runs whole in one pytest worker process, so a system test file's tests share the stack
    of real processes they need, and every worker that takes system files has a stack of its
    own (its own database, broker, providers, Celery worker and beat:
    `tests/system/conftest.py`). The files are handed out in this order as workers free up:
    the system files that take minutes (`long`: the crash windows, provider pressure,
    Stripe), the system tests that bring every process of their own (`own_processes`: the
    demo, chaos, bench and failover runs), the other system tests, the integration tests,
    then the unit tests, so the longest files start early and the short ones fill in at
    the end (a long file handed out late would be the run's tail).

    (pytest-xdist's `loadgroup` would group by `xdist_group` marks, but on pytest 9 its
    renamed node ids no longer reach the scheduler: every test went its own way.)"""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("long"):
            return 0
        if item.get_closest_marker("own_processes"):
            return 1
        if item.get_closest_marker("system"):
            return 2
        return 3 if item.nodeid.startswith("tests/integration/") else 4

    items.sort(key=rank)  # stable: each file's tests stay together and in their order


#: the ledger's own identity (its key namespace, its epochs), made by the migration and kept:
#: a test's switches are undone instead (`truncate_all` keeps epoch 0 only)
KEPT = ("ledger_identity", "ledger_epochs")

#: every other table of the ledger's schema, emptied before each test that takes `ledger`
TABLES = ", ".join(
    f'"{SCHEMA}".{table}' for table in reversed(ledger_tables()) if table not in KEPT
)


def truncate_all(database_url: str, attempts: int = 5) -> None:
    """Empty every table of the ledger's schema, children first, in one transaction.

    DELETE, not TRUNCATE: a test's tables hold a few rows, and TRUNCATE gives each table a
    new file and makes every other connection to the database reload its catalog cache
    (the system stack's workers and beat included) — about half a second per test here,
    against a few milliseconds. A system stack's beat may be mid-sweep, holding a row lock
    this waits for while it waits for one of ours: Postgres then aborts one of the two as a
    deadlock, and this tries again."""
    statements = "; ".join(
        [f"DELETE FROM {table}" for table in TABLES.split(", ")]
        + [
            f'DELETE FROM "{SCHEMA}".ledger_epochs WHERE epoch > 0',
            # a test that made the server look switched puts it back
            f'UPDATE "{SCHEMA}".ledger_epochs SET timeline = "{SCHEMA}".opledger_timeline(),'
            " suspect_until = NULL WHERE epoch = 0",
        ]
    )
    for attempt in range(attempts):
        try:
            with psycopg.connect(libpq(database_url)) as conn:  # one transaction, committed
                conn.execute(statements)  # no parameters: one round trip for them all
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def libpq(url: str) -> str:
    """The URL psycopg connects with (no SQLAlchemy driver suffix)."""
    parsed = make_url(url).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


def connect_ledger(url: str, **options: Any) -> psycopg.Connection[Any]:
    """A psycopg connection of the test's own whose unqualified names are the ledger's
    (its `search_path` is the ledger's schema, as the ledger's own connections' is)."""
    return psycopg.connect(libpq(url), options=f"-c search_path={SCHEMA}", **options)


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


class PostgresServer:
    """An admin handle on the test server: create and drop throwaway databases."""

    def __init__(self, url: str) -> None:
        self.url = url

    def create_database(self, prefix: str = "opledger_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(libpq(self.url), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return _with_database(self.url, name)

    def drop_database(self, url: str) -> None:
        name = make_url(url).database
        with psycopg.connect(libpq(self.url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_server() -> PostgresServer:
    try:
        url = devstack.postgres_url()
        with psycopg.connect(libpq(url), connect_timeout=5):
            pass
    except Exception as exc:  # a missing service is a skip on a laptop, a failure in CI
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Postgres available: {exc}")
    return PostgresServer(url)


@pytest.fixture(scope="session")
def database_url(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database()
    upgrade(url)
    yield url
    try:
        # after every test of the session, workers and migrations included: nothing of the
        # ledger was ever left in `public` (an application's own tables may be there: the
        # LangGraph example keeps its checkpointer in the ledger's database)
        with psycopg.connect(libpq(url)) as conn:
            left = conn.execute(
                "SELECT string_agg(name, ', ') FROM ("
                " SELECT relname AS name FROM pg_class"
                "  WHERE relnamespace = 'public'::regnamespace AND relname = ANY(%(ours)s)"
                " UNION ALL SELECT proname FROM pg_proc"
                "  WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'opledger%%'"
                " UNION ALL SELECT typname FROM pg_type"
                "  WHERE typnamespace = 'public'::regnamespace AND typname = 'op_status'"
                ") AS ledger",
                {"ours": [*ledger_tables(), "alembic_version"]},
            ).fetchone()
        assert left is not None and left[0] is None, f"the ledger's, in public: {left}"
    finally:
        pg_server.drop_database(url)


@pytest.fixture(scope="session")
def session_ledger(database_url: str) -> Iterator[Ledger]:
    ledger = Ledger.from_url(database_url, pool_size=10)
    yield ledger
    ledger.engine.dispose()


@pytest.fixture
def ledger(session_ledger: Ledger, database_url: str) -> Ledger:
    truncate_all(database_url)
    return session_ledger


@pytest.fixture
def grant(ledger: Ledger) -> str:
    """A live authorization for tenant 'acme' covering every crm and email action."""
    return ledger.grant(
        tenant="acme", scope=["crm.*", "email.*"], granted_by="test", ref="auth_acme"
    ).ref


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Redis on 127.0.0.1:6379, or a private one when none answers there (a fresh
    machine): its URL without a database number."""
    import redis

    from opledger.dev.processes import PrivateRedis

    local = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=2)
    try:
        local.ping()
    except redis.RedisError:
        server = PrivateRedis(tmp_path_factory.mktemp("redis"))
        server.start()
        try:
            yield server.url.rsplit("/", 1)[0]
        finally:
            server.kill()
    else:
        yield "redis://127.0.0.1:6379"
    finally:
        local.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A Redis server of the test's own (it keeps nothing on disk), killed after it: a
    test may restart or kill it."""
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def sandbox_server() -> Iterator[Sandbox]:
    with Sandbox() as sandbox:
        yield sandbox


@pytest.fixture
def sandbox(sandbox_server: Sandbox) -> Sandbox:
    """The sandbox providers, reset to defaults: every protection on, no faults."""
    sandbox_server.reset()
    return sandbox_server
