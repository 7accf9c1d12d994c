"""Part 2 of `opledger bench --agents`: settles drained with nobody waiting, then with
many asyncio agents of one process each awaiting one (the run and its JSON: `agents`)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine

from opledger.agents import EffectConfirmed, Effects
from opledger.dev.processes import wait_until
from opledger.ledger import Ledger
from opledger.ledger.pgschema import search_path

from .agents_monitor import POLL_NAME, Monitor, libpq
from .apps import ACTION
from .config import AgentsConfig
from .throughput import _empty_ledger, _Poll, prepare_many

#: the waiters are parked once the ledger's pool has run no statement for this long
QUIET_S = 0.5


def settles(
    cfg: AgentsConfig,
    effects: Effects,
    ledger: Ledger,
    monitor: Monitor,
    ledger_db: str,
    errors: list[str],
) -> dict[str, Any]:
    """Drains of `cfg.waiters` operations without waiters and with, alternating."""
    m = cfg.waiters
    without: list[float] = []
    with_: list[float] = []
    answered: list[int] = []
    ready: list[float] = []
    peak = 0
    with psycopg.connect(
        libpq(ledger.engine.url.render_as_string(hide_password=False)),
        autocommit=True,
        application_name=POLL_NAME,
        options=f"-c search_path={search_path(ledger.schema)}",  # the ledger's tables
    ) as conn:
        for r in range(cfg.settle_rounds):
            without.append(_drain(ledger, _Poll(conn, m), m, f"without-{r}", notify=False))
            monitor.reset()
            drained = _drain_waited(effects, ledger, _Poll(conn, m), m, f"with-{r}", errors)
            peak = max(peak, monitor.peak_waiting(ledger_db))
            with_.append(drained["seconds"])
            answered.append(drained["answered"])
            ready.append(drained["ready_s"])
    settles_without = m * len(without) / sum(without)
    settles_with = m * len(with_) / sum(with_)
    return {
        "ops": m,
        "without_s": without,
        "with_s": with_,
        "settles_s_without": settles_without,
        "settles_s_with": settles_with,
        "ratio": settles_with / settles_without,
        "waiters_answered": min(answered),
        "waiters_ready_s": max(ready),
        "waiting_connections_peak": peak,
    }


def _prepare(ledger: Ledger, m: int, label: str, *, notify: bool) -> list[str]:
    """`m` operations prepared (watched or not) in an emptied ledger, not yet published."""
    _empty_ledger(ledger, 1)  # the confirmed ones of earlier runs would count in the poll
    return prepare_many(
        ledger,
        m,
        lambda i: {
            "tenant": "t0",
            "workflow_id": f"settles-{label}",
            "intent_key": f"op-{i}",
            "action": ACTION,
            "target": f"t-{i}",
            "payload": {"i": i},
            "authorization_ref": "auth_t0",
            "notify": notify,
        },
    )


def _publish_and_time(op_ids: Sequence[str], poll: _Poll) -> float:
    """Publish every operation, wait until all are confirmed; the seconds from the first
    publish to the last confirmation (the ledger's clock and ours: the same machine's)."""
    from opledger.tasks.app import dispatch

    started = time.time()
    for op_id in op_ids:
        dispatch.delay(op_id)
    ended = float(wait_until(poll.finished, 600, "the operations to be confirmed", every=0.01))
    if ended <= started:
        raise RuntimeError("the operations were confirmed before they were published")
    return ended - started


def _drain(ledger: Ledger, poll: _Poll, m: int, label: str, *, notify: bool) -> float:
    return _publish_and_time(_prepare(ledger, m, label, notify=notify), poll)


class _Statements:
    """When `engine` last ran a statement, and how many it ran (since made)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.count = 0
        self.made = self.last = time.monotonic()
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_args: Any) -> None:
        with self._lock:
            self.count += 1
            self.last = time.monotonic()

    def quiet(self, at_least: int, patience: float) -> bool:
        """Whether `at_least` statements ran (or `patience` seconds went by since made) and
        none for QUIET_S seconds."""
        with self._lock:
            return (
                self.count >= at_least or time.monotonic() - self.made > patience
            ) and time.monotonic() - self.last >= QUIET_S

    def __enter__(self) -> _Statements:
        return self

    def __exit__(self, *_: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def _drain_waited(
    effects: Effects, ledger: Ledger, poll: _Poll, m: int, label: str, errors: list[str]
) -> dict[str, Any]:
    """`m` watched operations drained while `m` asyncio agents of this process, in one
    event loop, each await one of them; the seconds, how many were answered confirmed, and
    how long the agents took to park (every one had read its operation, and the ledger's
    pool was quiet) before the first publish."""
    op_ids = _prepare(ledger, m, label, notify=True)
    # A waiter publishes a prepared operation nobody has published yet (what the relay
    # would do later): these agents only wait, and the drain starts with the timed publish.
    waiting = Effects(ledger, publish=lambda _op_id: None, poll=effects.poll)
    answers: list[Any] = []
    started = threading.Event()

    async def agents() -> None:
        tasks = [asyncio.create_task(waiting.await_result(op_id, timeout=60)) for op_id in op_ids]
        await asyncio.sleep(0)
        started.set()
        answers.extend(await asyncio.gather(*tasks, return_exceptions=True))

    loop = threading.Thread(target=asyncio.run, args=(agents(),), name="waiters", daemon=True)
    t0 = time.monotonic()
    with _Statements(ledger.engine) as statements:
        loop.start()
        started.wait(60)
        # each agent watches its operation and reads it before it parks: at least one
        # statement each, then nothing until a notification wakes it
        wait_until(lambda: statements.quiet(m, patience=30), 120, "the waiters to park")
    ready_s = time.monotonic() - t0 - QUIET_S
    seconds = _publish_and_time(op_ids, poll)
    loop.join(timeout=90)
    confirmed = sum(isinstance(a, EffectConfirmed) for a in answers)
    for answer in answers:
        if not isinstance(answer, EffectConfirmed):
            what = answer.kind if hasattr(answer, "kind") else f"{type(answer).__name__}"
            errors.append(f"a waiter ({label}) got {what}: {answer}")
            break  # one says enough; the count is in waiters_answered
    if len(answers) != m:
        errors.append(f"{m - len(answers)} waiters ({label}) never returned")
    return {"seconds": seconds, "answered": confirmed, "ready_s": ready_s}
