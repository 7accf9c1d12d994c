"""`opledger chaos`: many operations through real workers while things break.

Workers are SIGKILLed at random moments and armed with random crash points (so they die
at worker boundaries), providers inject faults, Redis is restarted (queued messages are
lost) and, with a flag, Postgres too. Then the run waits, bounded in time, for every
operation to settle, and audits the providers' ground truth against the ledger.
Reproducible with the same seed (the schedule of breakage; process timing still varies).
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from opledger.adapters.smtp import message_id_for
from opledger.dev import crashpoints, devstack
from opledger.dev.forks import ForkedProc
from opledger.dev.processes import (
    PrivateBroker,
    Stack,
    private_broker,
    unconfigured_environ,
    use_broker,
)
from opledger.dev.sandbox import Sandbox
from opledger.ledger import DatabaseUnavailable, Ledger, Operation
from opledger.settings import Settings

from .audit import Audit, audit
from .variants import KINDS, build_registry, configure_sandbox

log = logging.getLogger("opledger.chaos")

#: short leases and intervals so recovery happens in seconds
FAST_ENV = {
    "OPLEDGER_LEASE_SECONDS": "3",
    "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "1",
    "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "2",
    "OPLEDGER_LOOKUP_INTERVAL_SECONDS": "0.5",
    "OPLEDGER_CHECK_BACKOFF_SECONDS": "2",
    "OPLEDGER_SWEEP_INTERVAL_SECONDS": "0.5",
    "OPLEDGER_RELAY_AFTER_SECONDS": "2",
    "OPLEDGER_SEARCH_LAG_SECONDS": "1",
    "OPLEDGER_KEY_RETENTION_SECONDS": "3600",
    "OPLEDGER_ADAPTERS": "opledger.dev.chaos.variants:build_registry",
}
HTTP_FAULTS = (
    "drop_after_commit",
    "delay_after_commit",
    "error_before_commit",
    "error_after_commit",
)
ACTIONS = [kind.action for kind in KINDS] + ["email.send.v1", "email.smtp_send.v1"]


@dataclass
class ChaosConfig:
    ops: int = 200
    seed: int = 1
    workers: int = 2
    fault_rate: float = 0.25
    kill_every: float = 2.0  #: mean seconds between two worker kills
    redis_restarts: int = 1  #: broker restarts (the name predates RabbitMQ)
    restart_postgres: bool = False
    chaos_seconds: float = 20.0  #: how long things keep breaking
    settle_timeout: float = 120.0  #: then how long the run may take to settle
    broker: str = "redis"  #: "redis" (a private server) or "rabbitmq" (a private vhost)


@dataclass
class ChaosResult:
    audit: Audit
    seed: int
    kills: int
    crash_points_armed: int
    redis_restarts: int
    postgres_restarts: int
    elapsed_s: float
    max_queued: dict[str, int] = field(default_factory=dict)  #: deepest queue seen, by name
    broker: str = "redis"
    #: workers and beats that exited by themselves (a startup check refused a restarting
    #: broker) and were started again, as a process supervisor would
    respawns: int = 0
    #: workers or beats that exited by themselves for any other reason (the run fails)
    unexpected_exits: int = 0

    def summary(self) -> dict[str, Any]:
        a = self.audit
        finished = a.confirmed + a.rejected + a.cancelled
        return {
            "ops": a.ops,
            "confirmed": a.confirmed,
            "rejected": a.rejected,
            "cancelled": a.cancelled,
            "unknown_in_review": a.unknown_in_review,
            "stuck": a.stuck,
            "lost": a.lost,
            "duplicate_effects": a.duplicate_effects,
            "dispatches_while_in_flight": a.dispatches_while_in_flight,
            "completion_rate": round(finished / a.ops, 4) if a.ops else 0.0,
            "ops_per_s": round((a.ops - a.stuck - a.lost) / self.elapsed_s, 2)
            if self.elapsed_s
            else 0.0,
            "kills": self.kills,
            "crash_points_armed": self.crash_points_armed,
            "redis_restarts": self.redis_restarts,
            "postgres_restarts": self.postgres_restarts,
            "respawns": self.respawns,
            "unexpected_exits": self.unexpected_exits,
            "elapsed_s": round(self.elapsed_s, 1),
            "max_dispatch_queued": self.max_queued.get("dispatch", 0),
            "max_reconcile_queued": self.max_queued.get("reconcile", 0),
            "seed": self.seed,
            "broker": self.broker,
            "review_share_by_provider": a.reviews_by_provider,
            "rate_limited_calls": a.limited,
            "problems": a.problems[:20],
        }

    @property
    def clean(self) -> bool:
        return self.audit.clean and not self.unexpected_exits


def stack_env(
    database_url: str, broker_url: str, sandbox: Sandbox, workdir: Path
) -> dict[str, str]:
    """The environment of a stack's processes: this one's, less any OPLEDGER_ settings,
    plus the fast settings and the given database, broker, providers and state dir."""
    env = unconfigured_environ()
    env.update(FAST_ENV)
    # The processes' own temporary files (billiard's pymp-* of a SIGKILLed worker) stay
    # inside the work directory, and go with it.
    tmp = workdir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        OPLEDGER_DATABASE_URL=database_url,
        OPLEDGER_BROKER_URL=broker_url,
        OPLEDGER_CRM_URL=sandbox.http_url,
        OPLEDGER_EMAIL_URL=sandbox.http_url,
        OPLEDGER_SMTP_HOST=sandbox.smtp_host,
        OPLEDGER_SMTP_PORT=str(sandbox.smtp_port),
        OPLEDGER_STATE_DIR=str(workdir),
        TMPDIR=str(tmp),
        PYTHONUNBUFFERED="1",
    )
    return env


def _intent(rng: random.Random, i: int) -> dict[str, Any]:
    action = ACTIONS[i % len(ACTIONS)]
    if action.startswith("email."):
        return {
            "action": action,
            "target": "owner@acme.test",
            "payload": {"to": "owner@acme.test", "subject": f"Case {i} closed", "text": "Done."},
        }
    missing = rng.random() < 0.05  # some are refused by the provider: rejected
    return {
        "action": action,
        "target": f"missing-{i}" if missing else f"case-{i}",
        "payload": {"note": f"closed by chaos run, op {i}"},
    }


def _inject_fault(sandbox: Sandbox, rng: random.Random, op: Operation) -> None:
    """A fault waiting for `op`'s request: matched by its key (its Message-ID over SMTP)."""
    if op.action.startswith("email.smtp"):
        sandbox.fault("smtp", "drop_after_data", key=message_id_for(op))
        return
    provider = "email" if op.action.startswith("email.") else "crm"
    sandbox.fault(provider, rng.choice(HTTP_FAULTS), key=op.idempotency_key, delay_s=1.5)


def run_chaos(
    config: ChaosConfig,
    *,
    progress: Callable[[int, int, dict[str, int]], None] | None = None,
    workdir: Path | None = None,
) -> ChaosResult:
    """Run one chaos experiment and audit it.

    Every process it starts is stopped and the temporary directory it made is removed,
    also when it is interrupted: wrap it in `stop_on_signals()` so SIGTERM unwinds too."""
    with contextlib.ExitStack() as cleanup:
        if workdir is None:
            work = Path(tempfile.mkdtemp(prefix="opledger-chaos-"))
            cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        else:
            work = workdir
        return _run(config, work, cleanup, progress)
    raise AssertionError("unreachable")  # pragma: no cover


def _run(
    config: ChaosConfig,
    work: Path,
    cleanup: contextlib.ExitStack,
    progress: Callable[[int, int, dict[str, int]], None] | None,
) -> ChaosResult:
    """Set up, break things for `chaos_seconds`, let it heal, audit.

    The schedule of breakage is drawn from the seed before the first operation goes out,
    and each draw after it happens in the same order, so one seed breaks the same things."""
    rng = random.Random(config.seed)
    rig = _Rig.start(config, work, cleanup)
    began = time.monotonic()  # the workers' start-up is part of the run's time...
    rig.start_processes()
    # ...but not of the chaos window: on a loaded machine the start-up alone could take
    # the whole window, and nothing would be broken at all
    started = time.monotonic()
    publisher = _Publisher(rig, rng)
    watch = _Watch(rig, progress)
    breakage = _Breakage(rig, rng, started)
    _break_things(rig, started, publisher, watch, breakage)
    _heal(rig, publisher, watch)
    elapsed = time.monotonic() - began
    return _result(rig, audit(rig.ledger, rig.sandbox.truth(), publisher.op_ids), watch, elapsed)


def _new_counters() -> dict[str, int]:
    return dict.fromkeys(("kills", "armed", "redis", "postgres", "respawns", "unexpected_exits"), 0)


@dataclass
class _Rig:
    """What one run starts (its database, broker, providers, workers and beat, and the
    ledger it audits), and the tally of what it did to them (`counters`, which `progress`
    is shown)."""

    config: ChaosConfig
    broker: PrivateBroker
    sandbox: Sandbox
    settings: Settings
    stack: Stack
    ledger: Ledger
    own_pg: devstack.EmbeddedPostgres | None  #: with `restart_postgres`: one it can restart
    names: list[str]  #: the workers'
    counters: dict[str, int] = field(default_factory=_new_counters)

    @classmethod
    def start(cls, config: ChaosConfig, work: Path, cleanup: contextlib.ExitStack) -> _Rig:
        """Start the services; `cleanup` stops each of them (the last started first)."""
        own_pg = None
        if config.restart_postgres:
            own_pg = devstack.EmbeddedPostgres(work / "postgres")
            cleanup.callback(own_pg.stop)
        server_url = own_pg.url if own_pg else devstack.postgres_url()
        database_url, drop_database = devstack.scratch_database(server_url, "opledger_chaos")
        cleanup.callback(_quietly, drop_database)
        broker = private_broker(config.broker, work)  # a restart loses every queued message
        cleanup.callback(broker.kill)
        broker.start()
        sandbox = Sandbox()
        cleanup.callback(sandbox.stop)
        sandbox.start()
        env = stack_env(database_url, broker.url, sandbox, work)
        settings = Settings.from_environ(env)
        # workers forked from one process that imported them: a kill is followed by a
        # restart in a fraction of the start-up's CPU (`dev.forks`)
        stack = Stack(env, work, proc=ForkedProc)
        cleanup.callback(stack.stop_all)
        ledger = Ledger.from_url(
            database_url, actions=build_registry(settings), **settings.ledger_options()
        )
        cleanup.callback(ledger.engine.dispose)
        names = [f"chaos{i}" for i in range(config.workers)]
        return cls(config, broker, sandbox, settings, stack, ledger, own_pg, names)

    @property
    def workflow_id(self) -> str:
        return f"chaos-{self.config.seed}"

    def start_processes(self) -> None:
        """This process publishes to the run's broker; the providers get their variants,
        the run its authorization; then the workers (each waited for) and the beat."""
        from opledger.tasks.app import app

        use_broker(app, self.broker.url)
        configure_sandbox(self.sandbox, self.settings)
        self.ledger.grant(tenant="acme", scope=["*"], granted_by="chaos", ref="auth_chaos")
        for name in self.names:
            self.stack.start_worker(name, concurrency=1)
        self.stack.start_beat()


class _Publisher:
    """Prepares the run's operations and publishes them, as an agent would (outbox-style).

    Paced over most of the chaos window, so kills and restarts hit work in flight (an
    operation prepared long before its message would be the relay's)."""

    def __init__(self, rig: _Rig, rng: random.Random) -> None:
        self.rig = rig
        self.rng = rng
        self.op_ids: list[str] = []
        self.every = 0.7 * rig.config.chaos_seconds / max(1, rig.config.ops)
        self.next_at = 0.0

    @property
    def all_out(self) -> bool:
        return len(self.op_ids) == self.rig.config.ops

    def catch_up(self, elapsed: float) -> None:
        """Publish each operation due `elapsed` seconds into the run."""
        while len(self.op_ids) < self.rig.config.ops and elapsed >= self.next_at:
            self.publish_next()
            self.next_at += self.every

    def publish_rest(self) -> None:
        while len(self.op_ids) < self.rig.config.ops:
            self.publish_next()

    def publish_next(self) -> None:
        """Prepare the next operation (maybe with a provider fault waiting for it), then
        publish it."""
        from opledger.tasks.app import dispatch

        rig, i = self.rig, len(self.op_ids)
        intent = _intent(self.rng, i)
        faulty = self.rng.random() < rig.config.fault_rate
        op = _retrying(
            lambda: rig.ledger.prepare(
                tenant="acme",
                workflow_id=rig.workflow_id,
                intent_key=f"op-{i}",
                authorization_ref="auth_chaos",
                **intent,
            ),
            rig.ledger,
        )
        self.op_ids.append(op.id)
        if faulty:
            _inject_fault(rig.sandbox, self.rng, op)
        with contextlib.suppress(Exception):  # a broker restarting: the relay finds it
            dispatch.delay(op.id)


class _Watch:
    """How many of the run's operations have settled, and the deepest each queue was;
    `progress` hears the count and the counters each time it is read."""

    def __init__(
        self, rig: _Rig, progress: Callable[[int, int, dict[str, int]], None] | None
    ) -> None:
        self.rig = rig
        self.progress = progress
        self.last = 0
        self.polled = 0.0
        self.max_queued = {"dispatch": 0, "reconcile": 0}

    def settled(self, force: bool = False) -> int:
        now = time.monotonic()
        if not force and now - self.polled < 1.0:  # the count is a query: once a second
            return self.last
        self.polled = now
        broker, ledger = self.rig.broker, self.rig.ledger
        for queue in self.max_queued:  # the broker must never hold a multiple of the backlog
            with contextlib.suppress(Exception):
                self.max_queued[queue] = max(self.max_queued[queue], broker.queued(queue))
        try:
            self.last = _settled_count(ledger, self.rig.workflow_id)
        except (DBAPIError, DatabaseUnavailable):  # Postgres is restarting: keep the count
            ledger.engine.dispose()
        if self.progress:
            self.progress(self.last, self.rig.config.ops, self.rig.counters)
        return self.last


class _Breakage:
    """What breaks when: broker restarts and (with its own Postgres) one Postgres restart
    at moments drawn up front inside the window, worker kills at exponentially distributed
    intervals; and, once a second, a supervisor's look at what exited by itself."""

    def __init__(self, rig: _Rig, rng: random.Random, started: float) -> None:
        window = rig.config.chaos_seconds
        self.rig = rig
        self.rng = rng
        self.started = started
        self.broker_at = sorted(
            rng.uniform(0.2, 0.8) * window for _ in range(rig.config.redis_restarts)
        )
        self.postgres_at = [rng.uniform(0.3, 0.7) * window] if rig.own_pg else []
        self.next_kill = rng.expovariate(1 / rig.config.kill_every)
        self.supervised_at = 0.0

    def step(self, elapsed: float) -> None:
        """Whatever is due `elapsed` seconds into the run."""
        rig = self.rig
        if elapsed >= self.next_kill:
            self._kill_one()
            self.next_kill = (
                time.monotonic() - self.started + self.rng.expovariate(1 / rig.config.kill_every)
            )
        if elapsed - self.supervised_at >= 1.0:  # a supervisor's restart delay
            self.supervised_at = elapsed
            _supervise(rig.stack, rig.names, rig.counters)
        if self.broker_at and elapsed >= self.broker_at[0]:
            self.broker_at.pop(0)
            rig.broker.restart()
            rig.counters["redis"] += 1
        if self.postgres_at and rig.own_pg and elapsed >= self.postgres_at[0]:
            self.postgres_at.pop(0)
            rig.own_pg.restart()
            rig.ledger.engine.dispose()
            rig.counters["postgres"] += 1

    def _kill_one(self) -> None:
        """SIGKILL a worker and start it again, more often than not armed with a crash
        point (so the new one dies at a worker boundary)."""
        rig, rng = self.rig, self.rng
        name = rng.choice(rig.names)
        rig.stack.kill_worker(name)
        rig.counters["kills"] += 1
        armed = {}
        if rng.random() < 0.6:
            point = f"{rng.choice(crashpoints.NAMES)}:{rng.randint(1, 4)}"
            armed = {"OPLEDGER_CRASHPOINT": point}
            rig.counters["armed"] += 1
        # Not waiting for it to be ready: the run goes on breaking things meanwhile.
        rig.stack.spawn_worker(name, concurrency=1, **armed)


def _break_things(
    rig: _Rig, started: float, publisher: _Publisher, watch: _Watch, breakage: _Breakage
) -> None:
    """Publish and break things until the window is over, or every operation settled."""
    while (elapsed := time.monotonic() - started) < rig.config.chaos_seconds:
        publisher.catch_up(elapsed)
        if publisher.all_out and watch.settled() == rig.config.ops:
            break
        breakage.step(elapsed)
        time.sleep(0.05)
        watch.settled()


def _heal(rig: _Rig, publisher: _Publisher, watch: _Watch) -> None:
    """What a short window left unpublished goes out now; then the run heals on clean
    workers only, bounded in time."""
    publisher.publish_rest()
    for name in rig.names:
        rig.stack.kill_worker(name)
        rig.stack.start_worker(name, concurrency=1)
    deadline = time.monotonic() + rig.config.settle_timeout
    while watch.settled(force=True) < len(publisher.op_ids) and time.monotonic() < deadline:
        _supervise(rig.stack, rig.names, rig.counters)
        time.sleep(1.0)


def _result(rig: _Rig, found: Audit, watch: _Watch, elapsed: float) -> ChaosResult:
    counters = rig.counters
    return ChaosResult(
        audit=found,
        seed=rig.config.seed,
        kills=counters["kills"],
        crash_points_armed=counters["armed"],
        redis_restarts=counters["redis"],
        postgres_restarts=counters["postgres"],
        respawns=counters["respawns"],
        unexpected_exits=counters["unexpected_exits"],
        elapsed_s=elapsed,
        max_queued=watch.max_queued,
        broker=rig.config.broker,
    )


#: the exit code of a worker or beat whose startup checks refused (`opledger.cli`)
REFUSED_AT_START = 4


def _supervise(stack: Stack, names: list[str], counters: dict[str, int]) -> None:
    """Start again the workers and the beat that exited by themselves, as systemd's
    `Restart=always` or compose's `restart: unless-stopped` would. One started while the
    broker restarts refuses at its startup checks (exit code 4): a `respawn`. Any other
    exit is a process that did not ride something out: an `unexpected_exit`, which makes
    the run fail (it is started again too, so the run can finish)."""
    procs = [(name, stack.workers.get(name)) for name in names] + [("beat", stack.beat)]
    for name, proc in procs:
        if proc is None or (code := proc.proc.poll()) is None:
            continue
        if code == REFUSED_AT_START:
            counters["respawns"] += 1
        else:
            counters["unexpected_exits"] += 1
            log.error("chaos: %s exited with %s:\n%s", name, code, proc.output()[-2000:])
        if name == "beat":
            stack.start_beat()
        else:
            stack.spawn_worker(name, concurrency=1)


T = TypeVar("T")


def _retrying(call: Callable[[], T], ledger: Ledger, attempts: int = 60) -> T:
    """`call()`, riding out a Postgres restart (the run restarts it on purpose)."""
    for n in range(attempts):
        try:
            return call()
        except (DBAPIError, DatabaseUnavailable):
            if n == attempts - 1:
                raise
            ledger.engine.dispose()
            time.sleep(0.5)
    raise AssertionError("unreachable")  # pragma: no cover


def _quietly(drop: Callable[[], None]) -> None:
    with contextlib.suppress(psycopg.Error):
        drop()


def _settled_count(ledger: Ledger, workflow_id: str) -> int:
    """The run's operations that are final, or unknown with an open review."""
    with ledger.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    """
                    SELECT count(*) FROM operations AS o
                    WHERE o.workflow_id = :wf
                      AND (o.status IN ('confirmed', 'rejected', 'cancelled')
                           OR (o.status = 'unknown' AND EXISTS (
                               SELECT 1 FROM reviews AS r
                               WHERE r.op_id = o.id AND r.resolved_at IS NULL)))
                    """
                ),
                {"wf": workflow_id},
            ).scalar_one()
        )
