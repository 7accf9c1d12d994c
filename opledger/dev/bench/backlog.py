"""A backlog of prepared operations behind a slow provider, drained with and without
relay and sweep, and once with the broker wiped halfway."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import text

from opledger.dev import devstack
from opledger.dev.forks import ForkedProc
from opledger.dev.processes import PrivateRedis, Proc, Stack, use_broker, wait_until
from opledger.ledger import Ledger
from opledger.settings import Settings

from .config import BenchConfig
from .throughput import prepare_and_publish

if TYPE_CHECKING:
    from opledger.dev.sandbox import Sandbox

#: The backlog runs: relay and sweep at the fastest settings the chaos run uses (its
#: FAST_ENV, which `stack_env` brings), with the default adapters.
BACKLOG_ENV = {"OPLEDGER_ADAPTERS": "opledger.adapters.defaults:build_registry"}
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


def backlog_drain(
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
    n = cfg.backlog
    database_url, drop = devstack.scratch_database(server_url, "opledger_backlog")
    redis.restart()  # empty, with nothing left of an earlier run
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(drop)
        sandbox, stack, ledger = _backlog_stack(database_url, work, mode, redis, cleanup)
        progress(f"backlog ({mode}): preparing {n} operations")
        _publish_backlog(ledger, redis, n, mode)
        _start_workers(stack, cfg, mode)
        # Timed: from both workers ready until every operation had its call (none left
        # prepared or dispatching), the same end in every mode.
        sampler = _Sampler(ledger, redis, n, mode)
        started = time.perf_counter()
        progress(f"backlog ({mode}): draining")
        deadline = time.monotonic() + max(600.0, n / 10)
        sampler.drain(deadline)
        elapsed = time.perf_counter() - started
        sampler.settle(deadline)  # untimed
        effects = sandbox.truth()["effects"]
        return {
            "ops_s": sampler.start.pending / elapsed,
            "msgs_per_op_max": sampler.ratio_max,
            "queued_max": float(sampler.queued_max),
            "settled": float(sampler.now.settled),
            "duplicates": float(sum(max(0, int(c) - 1) for c in effects.values())),
            "wiped_unsettled": float(sampler.wiped_unsettled),
            "elapsed_s": elapsed,
        }
    raise AssertionError("unreachable")  # pragma: no cover


def _backlog_stack(
    database_url: str, work: Path, mode: str, redis: PrivateRedis, cleanup: contextlib.ExitStack
) -> tuple[Sandbox, Stack, Ledger]:
    """The slow CRM, a stack for the workers and the ledger, with the backlog's grant;
    `cleanup` stops each."""
    from opledger.adapters.registry import load_registry
    from opledger.dev.chaos.run import stack_env
    from opledger.dev.sandbox import Sandbox

    sandbox = Sandbox()
    cleanup.callback(sandbox.stop)
    sandbox.start()
    sandbox.configure(processing_s=PROVIDER_S)
    env = {**stack_env(database_url, redis.url, sandbox, work), **BACKLOG_ENV}
    # its workers forked from one process that imported them (`dev.forks`): what this
    # measures is the drain, not how a worker starts
    stack = Stack(env, work, name=f"backlog-{mode}", proc=ForkedProc)
    settings = Settings.from_environ(env)
    ledger = Ledger.from_url(
        database_url, actions=load_registry(settings), **settings.ledger_options()
    )
    cleanup.callback(ledger.engine.dispose)
    cleanup.callback(stack.stop_all)
    ledger.grant(tenant="backlog", scope=["crm.*"], granted_by="bench", ref="auth_backlog")
    return sandbox, stack, ledger


def _publish_backlog(ledger: Ledger, redis: PrivateRedis, n: int, mode: str) -> None:
    """`n` operations prepared, each published once; all must be in the broker."""
    from opledger.tasks.app import app

    use_broker(app, redis.url)
    prepare_and_publish(
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
    if redis.queued("dispatch") != n:
        raise AssertionError(f"backlog ({mode}): {n} published, not in the broker")


def _start_workers(stack: Stack, cfg: BenchConfig, mode: str) -> None:
    """The beat (unless `mode` is 'off'), then two workers of `cfg.backlog_concurrency`
    processes each; returns when both are ready."""
    if mode != "off":
        stack.start_beat()
    workers = [
        ForkedProc(
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
            stack.env,
            stack.workdir / f"backlog-{mode}-{name}.log",
        )
        for name in ("b1", "b2")
    ]
    for proc in workers:
        stack.workers[proc.name] = proc
    for proc in workers:
        wait_until(partial(_ready, proc), 120, f"{proc.name} to start")


class _Sampler:
    """The backlog's counts (`now`; `start`: when the drain began) and the broker's depth,
    sampled every 0.5 s; the deepest queue and the most messages per waiting operation.
    In 'wipe' mode it wipes the broker once, when half are settled."""

    def __init__(self, ledger: Ledger, redis: PrivateRedis, n: int, mode: str) -> None:
        self.ledger = ledger
        self.redis = redis
        self.n = n
        self.mode = mode
        self.ratio_max = 0.0
        self.queued_max = 0
        self.wiped = False
        #: operations not yet settled when the broker was wiped (0: it never was)
        self.wiped_unsettled = 0
        self.start = self.now = self.counts()

    def counts(self) -> Any:
        with self.ledger.engine.connect() as conn:
            return conn.execute(text(BACKLOG_COUNTS)).one()

    def drain(self, deadline: float) -> None:
        """Until no operation is left prepared or dispatching."""
        while self.now.pending:
            if time.monotonic() > deadline:
                raise AssertionError(f"backlog ({self.mode}): {self.now.pending} never dispatched")
            time.sleep(0.5)
            self._sample()

    def _sample(self) -> None:
        try:
            queued = self.redis.queued("dispatch") + self.redis.queued("reconcile")
        except Exception:  # the broker is being wiped
            queued = 0
        self.now = self.counts()
        self.queued_max = max(self.queued_max, queued)
        if self.now.waiting >= max(100, self.n // 100):
            self.ratio_max = max(self.ratio_max, queued / self.now.waiting)
        if self.mode == "wipe" and not self.wiped and self.now.settled >= self.n // 2:
            self.redis.restart()  # every queued message is gone
            self.wiped = True
            self.wiped_unsettled = self.n - self.now.settled

    def settle(self, deadline: float) -> None:
        """Every operation must end settled, where a sweep runs at all."""
        while self.mode != "off" and self.now.settled < self.n:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"backlog ({self.mode}): {self.n - self.now.settled} never settled"
                )
            time.sleep(0.5)
            self.now = self.counts()


def _ready(proc: Proc) -> bool:
    return "ready." in proc.output()
