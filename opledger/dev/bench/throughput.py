"""Throughput: bare Celery's drain beside opledger's, the statements per operation, and
prepare rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from opledger.dev.processes import PrivateRedis, Stack, use_broker
from opledger.ledger import Ledger
from opledger.ledger.pgschema import search_path

from .apps import ACTION, bare, bare_counter, noop
from .config import BenchConfig
from .cpu import Drain, _cpu_s, _drain, _worker_argv


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


def prepare_and_publish(
    ledger: Ledger, n: int, intent: Callable[[int], dict[str, Any]]
) -> list[str]:
    """`prepare_many`, then one dispatch message per operation, in order: the full queue a
    drain starts on. Their ids."""
    from opledger.tasks.app import dispatch

    op_ids = prepare_many(ledger, n, intent)
    for op_id in op_ids:
        dispatch.delay(op_id)
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
    run = f"bench-{label or concurrency}-{tenants}"
    _empty_ledger(ledger, tenants)
    prepare_and_publish(
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
    # A backend reports its statistics when it exits (or after idling for a while): close
    # ours now, so the preparation phase cannot leak into the count below.
    ledger.engine.dispose()
    libpq = make_url(ledger.engine.url).set(drivername="postgresql")
    with psycopg.connect(
        libpq.render_as_string(hide_password=False),
        autocommit=True,
        options=f"-c search_path={search_path(ledger.schema)}",  # the ledger's tables
    ) as conn:
        poll = _Poll(conn, n)
        stats = _enable_statement_stats(conn)
        time.sleep(1.0)  # let earlier statistics settle
        before = poll.transactions()
        drain = _drain(
            stack,
            f"ledger-{label or concurrency}-{tenants}",
            "opledger.cli",
            _worker_argv(concurrency),
            poll.finished,
            redis_pid,
            before_kill=poll.read_backends,
        )
        time.sleep(1.5)  # the killed workers' backends report their statistics as they exit
        # Our own polls were one autocommitted statement each; so were the two statistics
        # reads and the backends' listing.
        spent = poll.transactions() - before - poll.polls - 3
        statements = _statement_stats(conn) if stats else None
    return _per_operation(n, drain, spent, poll.backends, statements)


def _empty_ledger(ledger: Ledger, tenants: int) -> None:
    """No operation left from an earlier drain; grants for `tenants` tenants (t0, t1...)."""
    with ledger.engine.begin() as conn:
        conn.execute(
            text(
                "TRUNCATE operations, operation_payloads, attempts, evidence, transitions,"
                " reviews, review_views, review_actions CASCADE"
            )
        )
    for t in range(tenants):
        ledger.grant(tenant=f"t{t}", scope=["bench.*"], granted_by="bench", ref=f"auth_t{t}")


class _Poll:
    """A drain watched from an autocommitted connection of its own: when it is over, the
    database's transaction count, the CPU of the worker's backends. It counts the polls it
    makes while the drain runs (`polls`): the transaction count includes them."""

    def __init__(self, conn: psycopg.Connection[Any], n: int) -> None:
        self.conn = conn
        self.n = n
        self.polls = 0
        self.backends: dict[int, float] = {}  #: CPU seconds by backend pid

    def transactions(self) -> int:
        self.conn.execute("SELECT pg_stat_clear_snapshot()")
        row = self.conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def finished(self) -> float | None:
        """None while operations are still prepared or dispatching; then the time the last
        one was confirmed (raises unless all `n` were)."""
        # cheap while the drain runs: the first row of a partial index, no count
        self.polls += 1
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM operations WHERE status = 'prepared')"
            " OR EXISTS (SELECT 1 FROM operations WHERE status = 'dispatching')"
        ).fetchone()
        if row is None or row[0]:
            return None
        self.polls += 1
        row = self.conn.execute(
            "SELECT count(*), extract(epoch FROM max(updated_at)) FROM operations"
            " WHERE status = 'confirmed'"
        ).fetchone()
        assert row is not None
        if row[0] != self.n:
            raise RuntimeError(f"the drain ended with {row[0]} of {self.n} operations confirmed")
        return float(row[1])

    def read_backends(self) -> None:
        """The worker's backends, while they still live (they exit with the worker)."""
        for (pid,) in self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall():
            cpu = _cpu_s(pid)
            if cpu is not None:
                self.backends[pid] = cpu


def _per_operation(
    n: int,
    drain: Drain,
    spent: int,
    backends: dict[int, float],
    statements: dict[str, float] | None,
) -> dict[str, Any]:
    """A ledger drain's measures, per operation."""
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
