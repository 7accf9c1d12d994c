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

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
from celery import Celery
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from opledger.adapters.base import Contract, Idempotency, Lookup, LookupResult
from opledger.adapters.registry import Registry
from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, Proc, Stack, use_broker, wait_until
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
        return Confirmed(
            receipt_id=claim.idempotency_key, binding=Binding(idempotency_key=claim.idempotency_key)
        )

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
    counter = bare_counter()
    if counter.incr("bench:done") >= _bare_total():  # the last one notes when it ended
        counter.set("bench:end", repr(time.time()))


_counter: Any = None
_total: int | None = None


def bare_counter() -> Any:
    global _counter
    if _counter is None:
        import redis

        _counter = redis.Redis.from_url(bare.conf.broker_url)
    return _counter


def _bare_total() -> int:
    global _total
    if _total is None:
        _total = int(bare_counter().get("bench:total") or 0)
    return _total


@dataclass
class BenchConfig:
    tasks: int = 10_000
    sizes: tuple[int, int] = (10_000, 1_000_000)
    stale: int = 100
    prepares: int = 2_000
    repeats: int = 5
    concurrency: int = os.cpu_count() or 2
    #: the ratio is measured again at each of these worker concurrencies
    concurrencies: tuple[int, ...] = (2, 4, 8)
    #: the ledger's drain is measured with the operations spread over this many tenants
    tenants: tuple[int, ...] = (1, 10, 100)
    backlog: int = 20_000  #: prepared operations behind the slow provider (0: skip)
    backlog_concurrency: int = 8  #: processes in each of the two backlog workers
    backlog_only: bool = False


QUICK = BenchConfig(tasks=2_000, sizes=(10_000, 100_000), prepares=500, repeats=3, backlog=3_000)

# The backlog runs: relay and sweep at the fastest settings the chaos run uses.
BACKLOG_ENV = {
    "OPLEDGER_ADAPTERS": "opledger.adapters.defaults:build_registry",
    "OPLEDGER_SWEEP_INTERVAL_SECONDS": "0.5",
    "OPLEDGER_RELAY_AFTER_SECONDS": "2",
    "OPLEDGER_CHECK_BACKOFF_SECONDS": "2",
    "OPLEDGER_LEASE_SECONDS": "3",
    "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "1",
    "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "2",
    "OPLEDGER_LOOKUP_INTERVAL_SECONDS": "0.5",
}
PROVIDER_S = 0.1  #: how long the sandbox CRM takes to answer, in the backlog runs

BACKLOG_COUNTS = """
SELECT count(*) FILTER (WHERE status IN ('confirmed', 'rejected', 'cancelled')
                          OR (status = 'unknown' AND EXISTS (
                              SELECT 1 FROM reviews AS r
                              WHERE r.op_id = o.id AND r.resolved_at IS NULL))) AS settled,
       count(*) FILTER (WHERE status IN ('prepared', 'unknown')) AS waiting,
       count(*) FILTER (WHERE status IN ('prepared', 'dispatching')) AS pending
FROM operations AS o WHERE tenant = 'backlog'
"""


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is not visible."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cpu_of(fields: list[str]) -> float:
    """User + system CPU seconds from a process's stat fields."""
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far, or None if it is not visible."""
    fields = _stat(pid)
    return _cpu_of(fields) if fields is not None else None


def _group_cpu_s(pgid: int) -> tuple[float, float]:
    """CPU seconds of the live processes in process group `pgid`: its leader (the worker's
    main process, which consumes, acknowledges and sends events) and the rest (the pool's
    processes, which run the tasks)."""
    main = pool = 0.0
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields is None or int(fields[2]) != pgid:
            continue
        if int(entry.name) == pgid:
            main += _cpu_of(fields)
        else:
            pool += _cpu_of(fields)
    return main, pool


@dataclass
class Drain:
    """One timed drain: seconds, and the CPU the worker processes spent during it."""

    seconds: float
    main_cpu_s: float  #: the worker's main process
    pool_cpu_s: float  #: the worker's pool processes (where the tasks run)
    broker_cpu_s: float | None

    @property
    def worker_cpu_s(self) -> float:
        return self.main_cpu_s + self.pool_cpu_s


def _drain(
    stack: Stack,
    name: str,
    module: str,
    argv: list[str],
    finished: Callable[[], float | None],
    redis_pid: int | None,
    before_kill: Callable[[], None] = lambda: None,
) -> Drain:
    """Start a worker on a full queue and wait until `finished()` returns the wall-clock
    time (`time.time()`) the last task ended at. Timed from the worker's 'ready'; the CPU
    of its processes (and of the broker) is read at 'ready' and once the drain is over, so
    start-up is excluded from both alike. `before_kill` runs while the worker still lives."""
    proc = Proc(name, argv, stack.env, stack.workdir / f"{name}.log", module=module)
    stack.workers[name] = proc
    wait_until(lambda: "ready." in proc.output(), 60, f"{name} to start", every=0.01)
    ready = time.time()
    cpu0 = _group_cpu_s(proc.proc.pid)
    broker0 = _cpu_s(redis_pid) if redis_pid else None
    ended = wait_until(finished, 600, f"{name} to drain", every=0.01)
    cpu1 = _group_cpu_s(proc.proc.pid)
    broker1 = _cpu_s(redis_pid) if redis_pid else None
    before_kill()
    stack.kill_worker(name)
    broker = broker1 - broker0 if broker0 is not None and broker1 is not None else None
    return Drain(
        seconds=float(ended) - ready,
        main_cpu_s=cpu1[0] - cpu0[0],
        pool_cpu_s=cpu1[1] - cpu0[1],
        broker_cpu_s=broker,
    )


def _worker_argv(concurrency: int) -> list[str]:
    return ["worker", "-c", str(concurrency), "--loglevel", "INFO"]


def bare_drain(stack: Stack, n: int, concurrency: int, redis_pid: int) -> Drain:
    """N no-op tasks drained by a bare Celery worker with opledger's worker settings."""
    counter = bare_counter()
    counter.delete("bench:done", "bench:end")
    counter.set("bench:total", n)
    for i in range(n):
        noop.apply_async(args=[f"op_{i:026d}"], queue="bench")

    def finished() -> float | None:
        end = counter.get("bench:end")
        return float(end) if end is not None else None

    return _drain(
        stack,
        f"bare-c{concurrency}",
        "celery",
        [
            "-A",
            "opledger.dev.bench:bare",
            "worker",
            "-Q",
            "bench",
            "-c",
            str(concurrency),
            "--loglevel",
            "INFO",
            "-E",
        ],
        finished,
        redis_pid,
    )


def _statement_stats(conn: psycopg.Connection[Any]) -> dict[str, float] | None:
    """Planning and execution time of the worker's two statements from pg_stat_statements,
    or None when the server does not load it (shared_preload_libraries)."""
    try:
        rows = conn.execute(
            "SELECT query, total_plan_time, total_exec_time FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    except psycopg.Error:
        return None
    plan = execute = 0.0
    for query, plan_ms, exec_ms in rows:
        # the claim and the outcome statements (queries.CLAIM, queries.RECORD_OUTCOME)
        if query.lstrip().startswith(("WITH win AS", "WITH attempt AS")):
            plan += plan_ms
            execute += exec_ms
    return {"plan_ms": plan, "exec_ms": execute}


def _enable_statement_stats(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
    except psycopg.Error:
        return False
    return True


def prepare_many(
    ledger: Ledger, n: int, intent: Callable[[int], dict[str, Any]], batch: int = 500
) -> list[str]:
    """Prepare `n` operations (`intent(i)` gives the i-th one's arguments), `batch` to a
    transaction (untimed set-up); their ids in order."""
    op_ids: list[str] = []
    for first in range(0, n, batch):
        with Session(ledger.engine) as session:
            op_ids += [
                ledger.prepare(**intent(i), session=session).id
                for i in range(first, min(n, first + batch))
            ]
            session.commit()
    return op_ids


def ledger_drain(
    stack: Stack,
    ledger: Ledger,
    n: int,
    concurrency: int,
    redis_pid: int,
    tenants: int = 1,
    label: str = "",
) -> dict[str, Any]:
    """N operations (spread over `tenants`) drained to confirmed by `opledger worker`:
    seconds, round trips per operation, and the CPU spent per operation by the worker
    processes, their Postgres backends and the broker."""
    from opledger.tasks.app import dispatch

    run = f"bench-{label or concurrency}-{tenants}"
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE operations, operation_payloads, attempts, evidence, transitions,"
                " reviews, review_views, review_actions CASCADE"
            )
        )
    for t in range(tenants):
        ledger.grant(tenant=f"t{t}", scope=["bench.*"], granted_by="bench", ref=f"auth_t{t}")
    op_ids = prepare_many(
        ledger,
        n,
        lambda i: {
            "tenant": f"t{i % tenants}",
            "workflow_id": run,
            "intent_key": f"op-{i}",
            "action": ACTION,
            "target": f"t-{i}",
            "payload": {"i": i},
            "authorization_ref": f"auth_t{i % tenants}",
        },
    )
    for op_id in op_ids:
        dispatch.delay(op_id)
    # A backend reports its statistics when it exits (or after idling for a while): close
    # ours now, so the preparation phase cannot leak into the count below.
    ledger.engine.dispose()
    libpq = make_url(ledger.engine.url).set(drivername="postgresql")
    polls = 0
    backends: dict[int, float] = {}
    with psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True) as poll:

        def transactions() -> int:
            poll.execute("SELECT pg_stat_clear_snapshot()")
            row = poll.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchone()
            assert row is not None
            return int(row[0])

        def finished() -> float | None:
            # cheap while the drain runs: the first row of a partial index, no count
            nonlocal polls
            polls += 1
            row = poll.execute(
                "SELECT EXISTS (SELECT 1 FROM operations WHERE status = 'prepared')"
                " OR EXISTS (SELECT 1 FROM operations WHERE status = 'dispatching')"
            ).fetchone()
            if row is None or row[0]:
                return None
            polls += 1
            row = poll.execute(
                "SELECT count(*), extract(epoch FROM max(updated_at)) FROM operations"
                " WHERE status = 'confirmed'"
            ).fetchone()
            assert row is not None
            if row[0] != n:
                raise RuntimeError(f"the drain ended with {row[0]} of {n} operations confirmed")
            return float(row[1])

        def read_backends() -> None:
            # the worker's backends, while they still live (they exit with the worker)
            for (pid,) in poll.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchall():
                cpu = _cpu_s(pid)
                if cpu is not None:
                    backends[pid] = cpu

        stats = _enable_statement_stats(poll)
        time.sleep(1.0)  # let earlier statistics settle
        before = transactions()
        drain = _drain(
            stack,
            f"ledger-{label or concurrency}-{tenants}",
            "opledger.cli",
            _worker_argv(concurrency),
            finished,
            redis_pid,
            before_kill=read_backends,
        )
        time.sleep(1.5)  # the killed workers' backends report their statistics as they exit
        # Our own polls were one autocommitted statement each; so were the two statistics
        # reads and the backends' listing.
        spent = transactions() - before - polls - 3
        statements = _statement_stats(poll) if stats else None
    return {
        "seconds": drain.seconds,
        "ops_s": n / drain.seconds,
        "round_trips_per_op": max(0.0, spent) / n,
        "client_cpu_ms_per_op": drain.worker_cpu_s / n * 1000,
        "client_main_cpu_ms_per_op": drain.main_cpu_s / n * 1000,
        "client_pool_cpu_ms_per_op": drain.pool_cpu_s / n * 1000,
        # the backends' CPU since they started: they connect lazily, after 'ready'
        "backend_cpu_ms_per_op": sum(backends.values()) / n * 1000 if backends else None,
        "broker_cpu_ms_per_op": drain.broker_cpu_s / n * 1000 if drain.broker_cpu_s else None,
        "plan_ms_per_op": statements["plan_ms"] / n if statements else None,
        "exec_ms_per_op": statements["exec_ms"] / n if statements else None,
    }


def throughput(
    cfg: BenchConfig, stack: Stack, ledger: Ledger, redis: PrivateRedis
) -> dict[str, Any]:
    """Bare Celery beside opledger, same worker settings, same broker, same queue depth;
    at `cfg.concurrency`, then again at each of `cfg.concurrencies`, then with the
    operations spread over each of `cfg.tenants`."""
    from opledger.tasks.app import app

    bare.conf.broker_url = redis.url
    use_broker(app, redis.url)
    assert redis.proc is not None
    pid = redis.proc.pid
    ledger.grant(tenant="bench", scope=["bench.*"], granted_by="bench", ref="auth_bench")
    result: dict[str, Any] = {}
    by_concurrency: dict[str, dict[str, Any]] = {}
    for c in dict.fromkeys((cfg.concurrency, *cfg.concurrencies)):
        celery = bare_drain(stack, cfg.tasks, c, pid)
        ours = ledger_drain(stack, ledger, cfg.tasks, c, pid)
        row = {
            "celery_ops_s": cfg.tasks / celery.seconds,
            "ledger_ops_s": ours["ops_s"],
            "ratio": celery.seconds / ours["seconds"],
            "celery_client_cpu_ms_per_op": celery.worker_cpu_s / cfg.tasks * 1000,
            "celery_client_main_cpu_ms_per_op": celery.main_cpu_s / cfg.tasks * 1000,
            "celery_client_pool_cpu_ms_per_op": celery.pool_cpu_s / cfg.tasks * 1000,
            "celery_broker_cpu_ms_per_op": (
                celery.broker_cpu_s / cfg.tasks * 1000 if celery.broker_cpu_s else None
            ),
            **{k: v for k, v in ours.items() if k not in ("seconds", "ops_s")},
        }
        by_concurrency[str(c)] = row
        if c == cfg.concurrency:
            result.update(row)
    result["by_concurrency"] = by_concurrency
    # the ledger's own CPU per operation: its worker processes' CPU beyond bare Celery's,
    # plus its Postgres backends
    if result.get("backend_cpu_ms_per_op") is not None:
        result["ledger_cpu_ms_per_op"] = (
            result["client_cpu_ms_per_op"]
            - result["celery_client_cpu_ms_per_op"]
            + result["backend_cpu_ms_per_op"]
        )
    result["ledger_ops_s_by_tenants"] = {
        str(t): ledger_drain(stack, ledger, cfg.tasks, cfg.concurrency, pid, t, "tenants")["ops_s"]
        for t in cfg.tenants
    }
    return result


FILL = """
INSERT INTO operations (id, tenant, workflow_id, intent_key, action, target, provider,
                        payload_digest, payload_size, authorization_ref, status, fence,
                        idempotency_key, created_at, updated_at)
SELECT 'op_' || upper(lpad(to_hex(i), 26, '0')), 'bench', 'fill', 'k' || i, 'bench.noop.v1',
       't' || i, 'bench', repeat('a', 64), 2, 'auth_bench', 'confirmed', 2,
       'op_' || upper(lpad(to_hex(i), 26, '0')), now() - interval '1 day', now() - interval '1 day'
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) AS i
"""

# Put the stale rows back before each timed sweep: expired leases, due checks, unclaimed.
RESTALE = """
ALTER TABLE operations DISABLE TRIGGER USER;
UPDATE operations SET status = 'dispatching', lease_token = 'x', lease_owner = 'gone',
       lease_expires_at = now() - interval '1 minute', next_check_at = NULL,
       changed_by = 'bench', change_reason = 'made stale'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'lease-');
UPDATE operations SET status = 'unknown', lease_token = NULL, lease_expires_at = NULL,
       next_check_at = now() - interval '1 minute'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'due-');
UPDATE operations SET status = 'prepared', enqueued_at = NULL,
       created_at = now() - interval '1 hour'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'relay-');
ALTER TABLE operations ENABLE TRIGGER USER;
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
        # history filler: no audit rows (they are not what a sweep reads)
        conn.exec_driver_sql("ALTER TABLE operations DISABLE TRIGGER USER")
        for start in range(filled + 1, size + 1, 200_000):
            conn.execute(text(FILL), {"start": start, "stop": min(size, start + 199_999)})
        conn.exec_driver_sql("ALTER TABLE operations ENABLE TRIGGER USER")
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


def backlog_drain(  # noqa: C901
    cfg: BenchConfig,
    server_url: str,
    work: Path,
    mode: str,
    redis: PrivateRedis,
    progress: Callable[[str], None] = lambda _m: None,
) -> dict[str, float]:
    """`cfg.backlog` prepared operations, each published once, behind a CRM answering in
    100 ms, drained by two workers. `mode`: 'guarded' (beat running: relay and sweep at
    their fastest), 'off' (no beat at all), 'wipe' (guarded, and the broker's data is
    wiped once when half are settled). Samples the broker's messages per waiting
    operation every 0.5 s, while at least 1% (and 100) of them are still waiting."""
    from opledger.dev.chaos.run import stack_env
    from opledger.dev.sandbox import Sandbox
    from opledger.tasks.app import app, dispatch

    n = cfg.backlog
    database_url, drop = devstack.scratch_database(server_url, "opledger_backlog")
    redis.restart()  # empty, with nothing left of an earlier run
    sandbox = Sandbox()
    stack: Stack | None = None
    ledger = None
    try:
        sandbox.start()
        sandbox.configure(processing_s=PROVIDER_S)
        env = {**stack_env(database_url, redis.url, sandbox, work), **BACKLOG_ENV}
        stack = Stack(env, work, name=f"backlog-{mode}")
        from opledger.adapters.registry import load_registry

        ledger = Ledger.from_url(database_url, actions=load_registry(Settings.from_environ(env)))
        ledger.grant(tenant="backlog", scope=["crm.*"], granted_by="bench", ref="auth_backlog")
        progress(f"backlog ({mode}): preparing {n} operations")
        op_ids = prepare_many(
            ledger,
            n,
            lambda i: {
                "tenant": "backlog",
                "workflow_id": "backlog",
                "intent_key": f"op-{i}",
                "action": "crm.close_case.v1",
                "target": f"case-{i}",
                "payload": {"note": f"backlog {i}"},
                "authorization_ref": "auth_backlog",
            },
        )
        use_broker(app, redis.url)
        for op_id in op_ids:
            dispatch.delay(op_id)
        if redis.queued("dispatch") != n:
            raise AssertionError(f"backlog ({mode}): {n} published, not in the broker")
        if mode != "off":
            stack.start_beat()
        workers = [
            Proc(
                name,
                [
                    "worker",
                    "-c",
                    str(cfg.backlog_concurrency),
                    "--loglevel",
                    "INFO",
                    "--hostname",
                    f"{name}@%h",
                ],
                env,
                work / f"backlog-{mode}-{name}.log",
            )
            for name in ("b1", "b2")
        ]
        for proc in workers:
            stack.workers[proc.name] = proc
        for proc in workers:
            wait_until(partial(_ready, proc), 120, f"{proc.name} to start")

        def counts() -> Any:
            with ledger.engine.connect() as conn:
                return conn.execute(text(BACKLOG_COUNTS)).one()

        # Timed: from both workers ready until every operation had its call (none left
        # prepared or dispatching), the same end in every mode.
        start = counts()
        started = time.perf_counter()
        progress(f"backlog ({mode}): draining")
        ratio_max = 0.0
        queued_max = 0
        wiped = False
        deadline = time.monotonic() + max(600.0, n / 10)
        now = start
        while now.pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"backlog ({mode}): {now.pending} never dispatched")
            time.sleep(0.5)
            try:
                queued = redis.queued("dispatch") + redis.queued("reconcile")
            except Exception:  # the broker is being wiped
                queued = 0
            now = counts()
            queued_max = max(queued_max, queued)
            if now.waiting >= max(100, n // 100):
                ratio_max = max(ratio_max, queued / now.waiting)
            if mode == "wipe" and not wiped and now.settled >= n // 2:
                redis.restart()  # every queued message is gone
                wiped = True
        elapsed = time.perf_counter() - started
        # Then (untimed) every operation must end settled, where a sweep runs at all.
        while mode != "off" and now.settled < n:
            if time.monotonic() > deadline:
                raise AssertionError(f"backlog ({mode}): {n - now.settled} never settled")
            time.sleep(0.5)
            now = counts()
        effects = sandbox.truth()["effects"]
        return {
            "ops_s": (start.pending) / elapsed,
            "msgs_per_op_max": ratio_max,
            "queued_max": float(queued_max),
            "settled": float(now.settled),
            "duplicates": float(sum(max(0, int(c) - 1) for c in effects.values())),
            "elapsed_s": elapsed,
        }
    finally:
        if stack is not None:
            stack.stop_all()
        if ledger is not None:
            ledger.engine.dispose()
        sandbox.stop()
        drop()


def _ready(proc: Proc) -> bool:
    return "ready." in proc.output()


def backlog(
    cfg: BenchConfig, server_url: str, work: Path, progress: Callable[[str], None]
) -> dict[str, float]:
    """The backlog benchmark: guarded drain beside a drain without relay and sweep, then
    a guarded drain whose broker is wiped halfway."""
    redis = PrivateRedis(work)  # one broker URL for the three runs (the producer pool)
    try:
        guarded = backlog_drain(cfg, server_url, work, "guarded", redis, progress)
        off = backlog_drain(cfg, server_url, work, "off", redis, progress)
        wipe = backlog_drain(cfg, server_url, work, "wipe", redis, progress)
    finally:
        redis.kill()
    return {
        "backlog_ops": cfg.backlog,
        "backlog_drain_ops_s": guarded["ops_s"],
        "backlog_drain_off_ops_s": off["ops_s"],
        "backlog_ratio": guarded["ops_s"] / off["ops_s"],
        "backlog_msgs_per_op_max": guarded["msgs_per_op_max"],
        "backlog_queued_max": guarded["queued_max"],
        "backlog_duplicates": guarded["duplicates"] + off["duplicates"] + wipe["duplicates"],
        "backlog_wipe_settled": wipe["settled"],
        "backlog_wipe_drain_ops_s": wipe["ops_s"],
        "backlog_wipe_msgs_per_op_max": wipe["msgs_per_op_max"],
    }


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def run_bench(
    cfg: BenchConfig, *, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Every measure; every process it starts is stopped and its directory removed."""
    with contextlib.ExitStack() as cleanup:
        work = Path(tempfile.mkdtemp(prefix="opledger-bench-"))
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        server_url = devstack.postgres_url()
        if cfg.backlog_only:
            return {
                k: round(float(v), 3) for k, v in backlog(cfg, server_url, work, progress).items()
            }
        url, drop = devstack.scratch_database(server_url, "opledger_bench")
        cleanup.callback(drop)
        redis = PrivateRedis(work)
        cleanup.callback(redis.kill)
        redis.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPLEDGER_")}
        env.update(
            OPLEDGER_DATABASE_URL=url,
            OPLEDGER_BROKER_URL=redis.url,
            OPLEDGER_ADAPTERS="opledger.dev.bench:build_registry",
            OPLEDGER_STATE_DIR=str(work),
            PYTHONUNBUFFERED="1",
        )
        stack = Stack(env, work)
        cleanup.callback(stack.stop_all)
        ledger = Ledger.from_url(url, actions=build_registry(Settings.from_environ(env)))
        cleanup.callback(ledger.engine.dispose)
        result: dict[str, Any] = {"tasks": cfg.tasks, "concurrency": cfg.concurrency}
        progress(f"throughput: {cfg.tasks} tasks, bare Celery then opledger")
        result.update(throughput(cfg, stack, ledger, redis))
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
        stack.stop_all()
        if cfg.backlog:
            result.update(backlog(cfg, server_url, work, progress))
        rounded: dict[str, Any] = _rounded(result)
        return rounded
    raise AssertionError("unreachable")  # pragma: no cover
