"""`opledger bench`: the ledger's cost measured beside bare Celery, in one run.

1. bare Celery: N no-op tasks carrying an id, drained by a prefork worker;
2. opledger: N prepared operations dispatched to an instant adapter (no network), drained
   to confirmed, by the same worker settings;
3. Postgres transactions per confirmed operation on the worker's path (pg_stat_database);
4. the sweeps (expired leases, due checks, relay) with 10k and 1M operations in the ledger
   and the same 100 stale rows each, with their query plans;
5. prepare throughput from one process, alone and inside a caller's transaction.

Timings are compared side by side (ratios), because a shared machine is noisy.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from opledger import devstack
from opledger.adapters.base import Contract, Idempotency, Lookup, LookupResult
from opledger.adapters.registry import Registry
from opledger.chaos.stack import PrivateRedis, Proc, Stack, wait_until
from opledger.ledger import Attempt, Binding, Claim, Confirmed, Ledger, Operation, Outcome
from opledger.settings import Settings

ACTION = "bench.noop.v1"


class InstantAdapter:
    """Confirms at once, without any network: the ledger's own cost, nothing else."""

    actions: tuple[str, ...] = (ACTION,)
    contract = Contract(
        provider="bench",
        idempotency=Idempotency(kind="keyed", scope="bench", retention=timedelta(days=1)),
        lookup=Lookup(kind="none"),
        request_timeout=timedelta(seconds=1),
        max_in_flight=timedelta(seconds=2),
        source="benchmark adapter: no provider at all",
    )

    def dispatch(self, claim: Claim) -> Outcome:
        return Confirmed(receipt_id=claim.key, binding=Binding(key=claim.key))

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        return LookupResult(verdict="inconclusive")


def build_registry(settings: Settings) -> Registry:
    return Registry([InstantAdapter()])


# A bare Celery app with opledger's worker settings and one no-op task carrying an id.
bare = Celery("opledger-bench")
bare.config_from_object("opledger.celeryconfig")
bare.conf.beat_schedule = {}


@bare.task(name="bench.noop")
def noop(op_id: str) -> None:
    bare_counter().incr("bench:done")


_counter: Any = None


def bare_counter() -> Any:
    global _counter
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(bare.conf.broker_url)
    return _counter


@dataclass
class BenchConfig:
    tasks: int = 10_000
    sizes: tuple[int, int] = (10_000, 1_000_000)
    stale: int = 100
    prepares: int = 2_000
    repeats: int = 5
    concurrency: int = os.cpu_count() or 2


QUICK = BenchConfig(tasks=2_000, sizes=(10_000, 100_000), prepares=500, repeats=3)


def _drain(
    stack: Stack, name: str, module: str, argv: list[str], done: Callable[[], int], total: int
) -> float:
    """Start a worker on a full queue; seconds from 'ready' until `done()` reaches `total`."""
    proc = Proc(name, argv, stack.env, stack.workdir / f"{name}.log", module=module)
    stack.workers[name] = proc
    wait_until(lambda: "ready." in proc.output(), 60, f"{name} to start", every=0.01)
    started = time.perf_counter()
    wait_until(lambda: done() >= total, 600, f"{name} to drain", every=0.01)
    elapsed = time.perf_counter() - started
    stack.kill_worker(name)
    return elapsed


def throughput(cfg: BenchConfig, stack: Stack, ledger: Ledger, redis_url: str) -> dict[str, float]:
    """Bare Celery beside opledger, same worker settings, same broker, same queue depth."""
    bare.conf.broker_url = redis_url
    counter = bare_counter()
    counter.delete("bench:done")
    for i in range(cfg.tasks):
        noop.apply_async(args=[f"op_{i:026d}"], queue="bench")
    celery_s = _drain(
        stack,
        "bare",
        "celery",
        [
            "-A",
            "opledger.bench:bare",
            "worker",
            "-Q",
            "bench",
            "-c",
            str(cfg.concurrency),
            "--loglevel",
            "INFO",
            "-E",
        ],
        lambda: int(counter.get("bench:done") or 0),
        cfg.tasks,
    )

    from opledger.tasks.app import app, dispatch

    app.conf.broker_url = redis_url
    ledger.grant(tenant="bench", scope=["bench.*"], granted_by="bench", ref="auth_bench")
    op_ids = [
        ledger.prepare(
            tenant="bench",
            workflow_id="bench",
            intent_key=f"op-{i}",
            action=ACTION,
            target=f"t-{i}",
            payload={"i": i},
            authorization_ref="auth_bench",
        ).id
        for i in range(cfg.tasks)
    ]
    for op_id in op_ids:
        dispatch.delay(op_id)
    # A backend reports its statistics when it exits (or after idling for a while): close
    # ours now, so the preparation phase cannot leak into the count below.
    ledger.engine.dispose()
    libpq = make_url(ledger.engine.url).set(drivername="postgresql")
    polls = 0
    with psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True) as poll:

        def transactions() -> int:
            poll.execute("SELECT pg_stat_clear_snapshot()")
            row = poll.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchone()
            assert row is not None
            return int(row[0])

        def confirmed() -> int:
            nonlocal polls
            polls += 1
            row = poll.execute(
                "SELECT count(*) FROM operations WHERE status = 'confirmed'"
            ).fetchone()
            assert row is not None
            return int(row[0])

        time.sleep(1.0)  # let earlier statistics settle
        before = transactions()
        ledger_s = _drain(
            stack,
            "ledger",
            "opledger.cli",
            ["worker", "-c", str(cfg.concurrency), "--loglevel", "INFO"],
            confirmed,
            cfg.tasks,
        )
        time.sleep(1.5)  # the killed workers' backends report their statistics as they exit
        # Our own polls were one autocommitted statement each; the two statistics reads too.
        spent = transactions() - before - polls - 2
    return {
        "celery_ops_s": cfg.tasks / celery_s,
        "ledger_ops_s": cfg.tasks / ledger_s,
        "ratio": celery_s / ledger_s,
        "round_trips_per_op": max(0.0, spent) / cfg.tasks,
    }


FILL = """
INSERT INTO operations (id, tenant, workflow_id, intent_key, action, target, provider,
                        payload_digest, payload_size, authorization_ref, status, fence,
                        provider_request_id, created_at, updated_at)
SELECT 'op_' || upper(lpad(to_hex(i), 26, '0')), 'bench', 'fill', 'k' || i, 'bench.noop.v1',
       't' || i, 'bench', repeat('a', 64), 2, 'auth_bench', 'confirmed', 2,
       'op_' || upper(lpad(to_hex(i), 26, '0')), now() - interval '1 day', now() - interval '1 day'
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) AS i
"""

# Put the stale rows back before each timed sweep: expired leases, due checks, unclaimed.
RESTALE = """
ALTER TABLE operations DISABLE TRIGGER opledger_guard_operation;
UPDATE operations SET status = 'dispatching', lease_token = 'x', lease_owner = 'gone',
       lease_expires_at = now() - interval '1 minute', next_check_at = NULL
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'lease-');
UPDATE operations SET status = 'unknown', lease_token = NULL, lease_expires_at = NULL,
       next_check_at = now() - interval '1 minute'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'due-');
UPDATE operations SET status = 'prepared', enqueued_at = NULL,
       created_at = now() - interval '1 hour'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'relay-');
ALTER TABLE operations ENABLE TRIGGER opledger_guard_operation;
"""

PLANS = {
    "expire_leases": "SELECT id FROM operations WHERE status = 'dispatching' "
    "AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT 500",
    "due_checks": "SELECT id FROM operations WHERE status = 'unknown' "
    "AND next_check_at <= now() ORDER BY next_check_at LIMIT 500",
    "relay": "SELECT id FROM operations WHERE status = 'prepared' "
    "AND created_at < now() - interval '1 minute' ORDER BY created_at LIMIT 500",
}


def sweep_cost(
    ledger: Ledger, size: int, cfg: BenchConfig, filled: int
) -> tuple[float, dict[str, str]]:
    """Median ms of one full sweep (expire + due + relay) with `size` rows in the ledger."""
    with ledger.engine.begin() as conn:
        for start in range(filled + 1, size + 1, 200_000):
            conn.execute(text(FILL), {"start": start, "stop": min(size, start + 199_999)})
        conn.exec_driver_sql("ANALYZE operations")
    timings = []
    for _ in range(cfg.repeats):
        with ledger.engine.begin() as conn:
            conn.exec_driver_sql(RESTALE)
        started = time.perf_counter()
        ledger.expire_leases(limit=500, backoff=timedelta(seconds=30))
        ledger.due_checks(limit=500, backoff=timedelta(seconds=30))
        ledger.relay(older_than=timedelta(minutes=1), publish=lambda _op, _gen: None, limit=500)
        timings.append((time.perf_counter() - started) * 1000)
    plans = {}
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql(RESTALE)
        for name, sql in PLANS.items():
            rows = conn.exec_driver_sql(f"EXPLAIN {sql}").all()
            plans[name] = " / ".join(r[0].strip() for r in rows)
    return statistics.median(timings), plans


def make_stale(ledger: Ledger, n: int) -> None:
    ledger.grant(tenant="bench-stale", scope=["bench.*"], granted_by="bench", ref="auth_stale")
    for kind in ("lease", "due", "relay"):
        for i in range(n):
            ledger.prepare(
                tenant="bench-stale",
                workflow_id="stale",
                intent_key=f"{kind}-{i}",
                action=ACTION,
                target=f"s-{i}",
                payload={"i": i},
                authorization_ref="auth_stale",
            )


def prepare_rates(ledger: Ledger, n: int) -> dict[str, float]:
    ledger.grant(tenant="bench-prep", scope=["bench.*"], granted_by="bench", ref="auth_prep")

    def one(i: int, prefix: str, session: Session | None = None) -> None:
        ledger.prepare(
            tenant="bench-prep",
            workflow_id=prefix,
            intent_key=f"k{i}",
            action=ACTION,
            target=f"t{i}",
            payload={"i": i, "note": "a small payload"},
            authorization_ref="auth_prep",
            session=session,
        )

    started = time.perf_counter()
    for i in range(n):
        one(i, "alone")
    alone = n / (time.perf_counter() - started)
    started = time.perf_counter()
    batch = 100
    for first in range(0, n, batch):
        with Session(ledger.engine) as session:
            for i in range(first, min(n, first + batch)):
                one(i, "in-tx", session)
            session.commit()
    in_tx = n / (time.perf_counter() - started)
    return {"prepare_ops_s": alone, "prepare_in_tx_ops_s": in_tx}


def run_bench(
    cfg: BenchConfig, *, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="opledger-bench-"))
    server_url = devstack.postgres_url()
    url, drop = devstack.scratch_database(server_url, "opledger_bench")
    redis = PrivateRedis(work)
    redis.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
    env.update(
        OPLEDGER_DATABASE_URL=url,
        OPLEDGER_BROKER_URL=redis.url,
        OPLEDGER_ADAPTERS="opledger.bench:build_registry",
        OPLEDGER_STATE_DIR=str(work),
        PYTHONUNBUFFERED="1",
    )
    stack = Stack(env, work)
    ledger = Ledger.from_url(url, actions=build_registry(Settings.from_environ(env)))
    result: dict[str, Any] = {"tasks": cfg.tasks, "concurrency": cfg.concurrency}
    try:
        progress(f"throughput: {cfg.tasks} tasks, bare Celery then opledger")
        result.update(throughput(cfg, stack, ledger, redis.url))
        progress(f"prepare: {cfg.prepares} alone and in caller transactions")
        result.update(prepare_rates(ledger, cfg.prepares))
        make_stale(ledger, cfg.stale)
        filled = 0
        plans: dict[str, dict[str, str]] = {}
        for label, size in zip(("10k", "1m"), cfg.sizes, strict=True):
            progress(f"sweeps with {size:,} operations in the ledger")
            ms, plans[label] = sweep_cost(ledger, size, cfg, filled)
            filled = size
            result[f"sweep_ms_{label}"] = ms
            result[f"sweep_rows_{label}"] = size
        result["sweep_plans"] = plans
        result["index_scans"] = all(
            "Index" in plan and "Seq Scan" not in plan
            for per_size in plans.values()
            for plan in per_size.values()
        )
        for key in (
            "celery_ops_s",
            "ledger_ops_s",
            "ratio",
            "round_trips_per_op",
            "sweep_ms_10k",
            "sweep_ms_1m",
            "prepare_ops_s",
            "prepare_in_tx_ops_s",
        ):
            result[key] = round(float(result[key]), 3)
        return result
    finally:
        stack.stop_all()
        ledger.engine.dispose()
        redis.kill()
        drop()
