"""A backlog of prepared operations behind a slow provider, drained with and without
relay and sweep, and once with the broker wiped halfway."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from sqlalchemy import text

from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, Proc, Stack, use_broker, wait_until
from opledger.ledger import Ledger
from opledger.settings import Settings

from .config import BenchConfig
from .throughput import prepare_many

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
