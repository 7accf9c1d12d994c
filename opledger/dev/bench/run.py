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
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, Stack, unconfigured_environ
from opledger.ledger import Ledger
from opledger.settings import Settings

from .apps import build_registry
from .backlog import backlog_drain
from .config import BenchConfig
from .pressure import pressure
from .sweep import make_stale, prepare_rates, sweep_cost
from .throughput import throughput


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def worker_env(database_url: str, broker_url: str, work: Path) -> dict[str, str]:
    """The environment the bench's workers run in: its database and broker, the instant
    adapter (`opledger.dev.bench:build_registry`), `work` as their state directory."""
    env = unconfigured_environ()
    env.update(
        OPLEDGER_DATABASE_URL=database_url,
        OPLEDGER_BROKER_URL=broker_url,
        OPLEDGER_ADAPTERS="opledger.dev.bench:build_registry",
        OPLEDGER_STATE_DIR=str(work),
        PYTHONUNBUFFERED="1",
    )
    return env


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
        env = worker_env(url, redis.url, work)
        stack = Stack(env, work)
        cleanup.callback(stack.stop_all)
        settings = Settings.from_environ(env)
        ledger = Ledger.from_url(url, actions=build_registry(settings), **settings.ledger_options())
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


def backlog(
    cfg: BenchConfig, server_url: str, work: Path, progress: Callable[[str], None]
) -> dict[str, float]:
    """The backlog benchmark: guarded drain beside a drain without relay and sweep, then
    a guarded drain whose broker is wiped halfway; then a healthy provider's drain alone
    and beside a hanging one (`pressure`)."""
    redis = PrivateRedis(work)  # one broker URL for every run (the producer pool)
    try:
        guarded = backlog_drain(cfg, server_url, work, "guarded", redis, progress)
        off = backlog_drain(cfg, server_url, work, "off", redis, progress)
        wipe = backlog_drain(cfg, server_url, work, "wipe", redis, progress)
        # a healthy provider's drain beside a hanging one (`pressure`)
        beside_hung = pressure(cfg, server_url, work, redis, progress)
    finally:
        redis.kill()
    return {
        **beside_hung,
        "backlog_ops": cfg.backlog,
        "backlog_drain_ops_s": guarded["ops_s"],
        "backlog_drain_off_ops_s": off["ops_s"],
        "backlog_ratio": guarded["ops_s"] / off["ops_s"],
        "backlog_msgs_per_op_max": guarded["msgs_per_op_max"],
        "backlog_queued_max": guarded["queued_max"],
        "backlog_duplicates": guarded["duplicates"] + off["duplicates"] + wipe["duplicates"],
        "backlog_wipe_settled": wipe["settled"],
        # how many were still to settle when the broker was wiped: above 0, the wipe
        # took messages that the relay and the sweeps had to make up for
        "backlog_wipe_unsettled": wipe["wiped_unsettled"],
        "backlog_wipe_drain_ops_s": wipe["ops_s"],
        "backlog_wipe_msgs_per_op_max": wipe["msgs_per_op_max"],
    }
