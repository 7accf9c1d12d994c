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
import os
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

from opledger.dev import devstack
from opledger.dev.processes import Stack, private_broker, use_broker
from opledger.dev.sandbox import Sandbox
from opledger.ledger import DatabaseUnavailable, Ledger
from opledger.settings import Settings

from .audit import Audit, audit
from .variants import KINDS, build_registry, configure_sandbox

#: short leases and intervals so recovery happens in seconds
log = logging.getLogger("opledger.chaos")

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
CRASH_POINTS = (
    "dispatch.after_claim",
    "dispatch.before_call",
    "dispatch.after_call",
    "dispatch.after_save",
    "reconcile.before_lookup",
    "reconcile.after_lookup",
    "relay.after_publish",
)
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
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


def _inject_fault(sandbox: Sandbox, rng: random.Random, op_id: str, action: str) -> None:
    if action.startswith("email.smtp"):
        sandbox.fault("smtp", "drop_after_data", key=f"<{op_id}@opledger>")
        return
    provider = "email" if action.startswith("email.") else "crm"
    sandbox.fault(provider, rng.choice(HTTP_FAULTS), key=op_id, delay_s=1.5)


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


def _run(  # noqa: C901
    config: ChaosConfig,
    work: Path,
    cleanup: contextlib.ExitStack,
    progress: Callable[[int, int, dict[str, int]], None] | None,
) -> ChaosResult:
    rng = random.Random(config.seed)
    own_pg = None
    if config.restart_postgres:
        own_pg = devstack.EmbeddedPostgres(work / "postgres")
        cleanup.callback(own_pg.stop)
    server_url = own_pg.url if own_pg else devstack.postgres_url()
    database_url, drop_database = devstack.scratch_database(server_url, "opledger_chaos")
    cleanup.callback(_quietly, drop_database)
    redis = private_broker(config.broker, work)  # a restart loses every queued message
    cleanup.callback(redis.kill)
    redis.start()
    sandbox = Sandbox()
    cleanup.callback(sandbox.stop)
    sandbox.start()
    env = stack_env(database_url, redis.url, sandbox, work)
    settings = Settings.from_environ(env)
    stack = Stack(env, work)
    cleanup.callback(stack.stop_all)
    ledger = Ledger.from_url(database_url, actions=build_registry(settings))
    cleanup.callback(ledger.engine.dispose)
    counters = {
        "kills": 0,
        "armed": 0,
        "redis": 0,
        "postgres": 0,
        "respawns": 0,
        "unexpected_exits": 0,
    }
    started = time.monotonic()
    op_ids: list[str] = []

    from opledger.tasks.app import app, dispatch

    use_broker(app, redis.url)
    configure_sandbox(sandbox, settings)
    ledger.grant(tenant="acme", scope=["*"], granted_by="chaos", ref="auth_chaos")
    names = [f"chaos{i}" for i in range(config.workers)]
    for name in names:
        stack.start_worker(name, concurrency=1)
    stack.start_beat()

    def publish_next() -> None:
        """Prepare the next operation and publish it, as an agent would (outbox-style)."""
        i = len(op_ids)
        intent = _intent(rng, i)
        faulty = rng.random() < config.fault_rate
        op = _retrying(
            lambda: ledger.prepare(
                tenant="acme",
                workflow_id=f"chaos-{config.seed}",
                intent_key=f"op-{i}",
                authorization_ref="auth_chaos",
                **intent,
            ),
            ledger,
        )
        op_ids.append(op.id)
        if faulty:
            _inject_fault(sandbox, rng, op.id, intent["action"])
        with contextlib.suppress(Exception):  # a broker restarting: the relay finds it
            dispatch.delay(op.id)

    # Prepare and publish over most of the chaos window, so kills and restarts hit work
    # in flight (an operation prepared long before its message would be the relay's).
    publish_every = 0.7 * config.chaos_seconds / max(1, config.ops)
    next_publish = 0.0
    last = [0]
    polled = [0.0]
    max_queued = {"dispatch": 0, "reconcile": 0}

    def report(force: bool = False) -> int:
        now = time.monotonic()
        if not force and now - polled[0] < 1.0:  # the count is a query: once a second
            return last[0]
        polled[0] = now
        for queue in max_queued:  # the broker must never hold a multiple of the backlog
            with contextlib.suppress(Exception):
                max_queued[queue] = max(max_queued[queue], redis.queued(queue))
        try:
            last[0] = _settled_count(ledger, f"chaos-{config.seed}")
        except (DBAPIError, DatabaseUnavailable):  # Postgres is restarting: keep the count
            ledger.engine.dispose()
        if progress:
            progress(last[0], config.ops, counters)
        return last[0]

    # Break things for a while.
    redis_at = sorted(
        rng.uniform(0.2, 0.8) * config.chaos_seconds for _ in range(config.redis_restarts)
    )
    postgres_at = [rng.uniform(0.3, 0.7) * config.chaos_seconds] if own_pg else []
    next_kill = rng.expovariate(1 / config.kill_every)
    supervised_at = 0.0
    while (elapsed := time.monotonic() - started) < config.chaos_seconds:
        while len(op_ids) < config.ops and elapsed >= next_publish:
            publish_next()
            next_publish += publish_every
        if len(op_ids) == config.ops and report() == config.ops:
            break
        if elapsed >= next_kill:
            name = rng.choice(names)
            stack.kill_worker(name)
            counters["kills"] += 1
            armed = {}
            if rng.random() < 0.6:
                point = f"{rng.choice(CRASH_POINTS)}:{rng.randint(1, 4)}"
                armed = {"OPLEDGER_CRASHPOINT": point}
                counters["armed"] += 1
            # Not waiting for it to be ready: the run goes on breaking things meanwhile.
            stack.spawn_worker(name, concurrency=1, **armed)
            next_kill = time.monotonic() - started + rng.expovariate(1 / config.kill_every)
        if elapsed - supervised_at >= 1.0:  # a supervisor's restart delay
            supervised_at = elapsed
            _supervise(stack, names, counters)
        if redis_at and elapsed >= redis_at[0]:
            redis_at.pop(0)
            redis.restart()
            counters["redis"] += 1
        if postgres_at and own_pg and elapsed >= postgres_at[0]:
            postgres_at.pop(0)
            own_pg.restart()
            ledger.engine.dispose()
            counters["postgres"] += 1
        time.sleep(0.05)
        report()

    while len(op_ids) < config.ops:  # a short chaos window: the rest goes out now
        publish_next()
    # Then let it heal: clean workers only, bounded in time.
    for name in names:
        stack.kill_worker(name)
        stack.start_worker(name, concurrency=1)
    deadline = time.monotonic() + config.settle_timeout
    while report(force=True) < len(op_ids) and time.monotonic() < deadline:
        _supervise(stack, names, counters)
        time.sleep(1.0)
    elapsed_total = time.monotonic() - started
    result = audit(ledger, sandbox.truth(), op_ids)
    return ChaosResult(
        audit=result,
        seed=config.seed,
        kills=counters["kills"],
        crash_points_armed=counters["armed"],
        redis_restarts=counters["redis"],
        postgres_restarts=counters["postgres"],
        respawns=counters["respawns"],
        unexpected_exits=counters["unexpected_exits"],
        elapsed_s=elapsed_total,
        max_queued=max_queued,
        broker=config.broker,
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
