"""A healthy provider's drain with and without a hanging one beside it (issue #43).

The healthy provider is the sandbox CRM (answering in `PROVIDER_S`), limited to as many
calls in flight as the backlog workers have processes (`cfg.backlog_concurrency`); the
hanging one is the email API pointed at a server that accepts every connection and never
answers (`dev.hanging`), limited to `HUNG_SLOTS`. One worker of that many processes plus
`HUNG_SLOTS` (the hung calls hold theirs for the whole drain), with beat running, drains
the healthy operations twice on a fresh database:

- *alone*: the healthy operations only;
- *beside*: first a backlog of emails, each published once (the first `HUNG_SLOTS` take
  the slots and hang, the rest wait for them), then the healthy operations.

The ratio of the two drain rates is the measure (target >= 0.9): waiting operations that
held worker processes, or took the relay's budget, would show as a slower healthy drain.
Counted beside it: the connections the hanging server took (its slots, no more) and how
often the waiting emails were published again while they waited (0: each deferred once,
until the hung calls' in-flight deadline).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

from opledger.dev import devstack
from opledger.dev.forks import ForkedProc
from opledger.dev.hanging import hanging_server
from opledger.dev.processes import PrivateRedis, Stack, use_broker, wait_until
from opledger.ledger import Ledger

from .backlog import _backlog_stack, _ready
from .config import BenchConfig

HUNG_SLOTS = 2  #: the hanging provider's calls in flight at most
#: long enough that no hung call ends, nor its lease, during a drain
HANG_ENV = {
    "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "600",
    "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "600",
    "OPLEDGER_LEASE_SECONDS": "1800",
}

COUNTS = """
SELECT count(*) FILTER (WHERE action LIKE 'crm.%' AND status IN ('prepared', 'dispatching'))
           AS healthy_pending,
       count(*) FILTER (WHERE action LIKE 'crm.%' AND status = 'confirmed') AS healthy_done,
       coalesce(sum(relay_gen) FILTER (WHERE action LIKE 'email.%' AND status = 'prepared'), 0)
           AS waiting_published_again
FROM operations WHERE tenant = 'backlog'
"""


def pressure(
    cfg: BenchConfig,
    server_url: str,
    work: Path,
    redis: PrivateRedis,
    progress: Callable[[str], None],
) -> dict[str, float]:
    """The two drains side by side (the module says how)."""
    n = min(2_000, max(100, cfg.backlog // 10))
    alone = _drain(cfg, server_url, work, redis, n, 0, progress)
    beside = _drain(cfg, server_url, work, redis, n, max(20, n // 2), progress)
    return {
        "pressure_healthy_ops": n,
        "pressure_alone_ops_s": alone["ops_s"],
        "pressure_beside_hung_ops_s": beside["ops_s"],
        "pressure_ratio": beside["ops_s"] / alone["ops_s"],
        "pressure_hung_connections": beside["connections"],
        "pressure_waiting_published_again": beside["published_again"],
    }


def _drain(
    cfg: BenchConfig,
    server_url: str,
    work: Path,
    redis: PrivateRedis,
    n: int,
    hung: int,
    progress: Callable[[str], None],
) -> dict[str, float]:
    """`n` healthy operations drained, after `hung` emails to the hanging provider."""
    mode = "beside" if hung else "alone"
    database_url, drop = devstack.scratch_database(server_url, "opledger_pressure")
    redis.restart()
    with contextlib.ExitStack() as cleanup, hanging_server() as (port, accepted):
        cleanup.callback(drop)
        sandbox, stack, ledger = _backlog_stack(
            database_url, work, f"pressure-{mode}", redis, cleanup
        )
        ledger.grant(tenant="backlog", scope=["email.*"], granted_by="bench", ref="auth_mail")
        limits = {
            "crm": {"concurrency": cfg.backlog_concurrency},
            "email": {"concurrency": HUNG_SLOTS},
        }
        stack.env.update(
            HANG_ENV,
            OPLEDGER_EMAIL_URL=f"http://127.0.0.1:{port}",
            OPLEDGER_PROVIDER_LIMITS=json.dumps(limits),
        )
        stack.start_beat()
        worker = _start_worker(stack, cfg.backlog_concurrency + HUNG_SLOTS, mode)
        progress(f"pressure ({mode}): {hung} emails to a hanging provider, then {n} CRM calls")
        _publish(ledger, redis, "email", hung)
        if hung:
            wait_until(lambda: len(accepted) >= HUNG_SLOTS, 60, "the hung calls")
        started = time.perf_counter()
        _publish(ledger, redis, "crm", n)
        deadline = time.monotonic() + max(300.0, n / 2)
        while (counts := _counts(ledger)).healthy_pending or counts.healthy_done < n:
            if time.monotonic() > deadline or worker.proc.poll() is not None:
                raise AssertionError(f"pressure ({mode}): {counts.healthy_pending} never done")
            time.sleep(0.1)
        elapsed = time.perf_counter() - started
        effects = sandbox.truth()["effects"]
        if any(int(c) > 1 for c in effects.values()):
            raise AssertionError(f"pressure ({mode}): an effect applied twice")
        return {
            "ops_s": n / elapsed,
            "connections": float(len(accepted)),
            "published_again": float(counts.waiting_published_again),
        }
    raise AssertionError("unreachable")  # pragma: no cover


def _start_worker(stack: Stack, processes: int, mode: str) -> ForkedProc:
    proc = ForkedProc(
        "p1",
        ["worker", "-c", str(processes), "--loglevel", "INFO", "--hostname", "p1@%h"],
        stack.env,
        stack.workdir / f"pressure-{mode}-p1.log",
    )
    stack.workers[proc.name] = proc
    wait_until(lambda: _ready(proc), 120, "the pressure worker to start")
    return proc


def _publish(ledger: Ledger, redis: PrivateRedis, kind: str, n: int) -> None:
    """`n` operations of `kind` ("crm" or "email") prepared and published once each."""
    from opledger.tasks.app import app, dispatch

    use_broker(app, redis.url)
    for i in range(n):
        if kind == "crm":
            action, target = "crm.close_case.v1", f"case-{i}"
            payload: dict[str, object] = {"note": f"pressure {i}"}
        else:
            action, target = "email.send.v1", "owner@acme.test"
            payload = {"to": target, "subject": f"pressure {i}", "text": "t"}
        op = ledger.prepare(
            tenant="backlog",
            workflow_id="pressure",
            intent_key=f"{kind}-{i}",
            action=action,
            target=target,
            payload=payload,
            authorization_ref="auth_backlog" if kind == "crm" else "auth_mail",
        )
        dispatch.delay(op.id)


def _counts(ledger: Ledger) -> Any:
    with ledger.engine.connect() as conn:
        return conn.execute(text(COUNTS)).one()
