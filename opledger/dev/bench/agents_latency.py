"""Part 1 of `opledger bench --agents`: effect() latency, opledger beside DBOS, their rounds
interleaved at each agent count (the run and its JSON: `agents`)."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text

from opledger.agents import EffectConfirmed, Effects
from opledger.ledger import Ledger

from .agents_monitor import Monitor
from .apps import ACTION
from .config import AgentsConfig

#: how long the idle rate of transactions is measured for
IDLE_RATE_S = 5.0

#: the sides, their rounds interleaved in this order: opledger through its worker,
#: opledger dispatching in the agent's own thread (`Effects(..., inline=True)`), DBOS
SIDES = ("opledger", "inline", "dbos")


class _NotConfirmed(Exception):
    pass


@dataclass
class _Call:
    started: float  #: perf_counter
    ended: float
    wall_started: float  #: time.time(), beside the ledger's timestamps
    wall_ended: float
    op_id: str | None


@dataclass
class _Side:
    """One side's rounds at one agent count, pooled."""

    latencies_ms: list[float] = field(default_factory=list)
    effects: int = 0
    seconds: float = 0.0
    calls: int = 0  #: every call, warm-ups included
    xacts: float = 0.0  #: the database's transactions at this count, less its idle ones
    peak: int = 0
    to_confirmed_ms: list[float] = field(default_factory=list)
    to_return_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **_percentiles(self.latencies_ms),
            "effects": self.effects,
            "effects_s": self.effects / self.seconds if self.seconds else 0.0,
            "xacts_per_effect": self.xacts / self.calls if self.calls else None,
            "peak_connections": self.peak,
        }
        if self.to_confirmed_ms:
            out["start_to_confirmed_ms"] = statistics.median(self.to_confirmed_ms)
            out["confirmed_to_return_ms"] = statistics.median(self.to_return_ms)
        return out


class Sides:
    """Part 1: the two sides' interleaved rounds at each agent count."""

    def __init__(
        self,
        cfg: AgentsConfig,
        effects: Effects,
        dbos: Any,
        ledger: Ledger,
        monitor: Monitor,
        ledger_db: str,
        dbos_db: str,
        errors: list[str],
    ) -> None:
        self.cfg = cfg
        self.effects = effects
        self.dbos = dbos
        self.ledger = ledger
        self.monitor = monitor
        self.ledger_db = ledger_db
        self.dbos_db = dbos_db
        self.errors = errors
        self.idle = {ledger_db: 0.0, dbos_db: 0.0}  #: transactions per second, idle
        #: the same ledger, each effect claimed and sent in the agent's own thread
        self.inline = Effects(ledger, inline=True)

    def idle_rates(self) -> dict[str, float]:
        """Each database's transactions per second with nothing to do, once every backend
        reported what it did (which part 1 then subtracts); `opledger` and `dbos`."""
        time.sleep(self.cfg.stats_wait)
        before = {db: self.monitor.transactions(db) for db in self.idle}
        time.sleep(IDLE_RATE_S)
        for db in self.idle:
            self.idle[db] = (self.monitor.transactions(db) - before[db]) / IDLE_RATE_S
        return {"opledger": self.idle[self.ledger_db], "dbos": self.idle[self.dbos_db]}

    def ours(self, tag: str, inline: bool = False) -> Callable[[int, int], str | None]:
        effects = self.inline if inline else self.effects

        def call(i: int, k: int) -> str | None:
            result = effects.effect(
                tenant="bench",
                run=f"agents-{tag}-{i}",
                action=ACTION,
                target=f"t-{i}",
                payload={"n": k},
                authorization_ref="auth_bench",
                intent_key=f"{k}",
                wait=self.cfg.wait,
            )
            if not isinstance(result, EffectConfirmed):
                raise _NotConfirmed(f"{result.kind}: {result.message}")
            return result.op_id

        return call

    def theirs(self, tag: str) -> Callable[[int, int], str | None]:
        def call(i: int, k: int) -> str | None:
            receipt = self.dbos.effect(f"agents-{tag}-{i}/{k}", {"n": k})
            if receipt.get("receipt_id") != f"agents-{tag}-{i}/{k}":
                raise _NotConfirmed(f"DBOS answered {receipt!r}")
            return None

        return call

    def at(self, n: int, progress: Callable[[str], None]) -> dict[str, Any]:
        """Both sides at `n` agents, their rounds interleaved; each side's summary and the
        ratios."""
        sides = {name: _Side() for name in SIDES}
        # every backend has reported what it did before (idle_rates, or the previous
        # count's end): the transactions from here to the end are this count's
        datnames = {"opledger": self.ledger_db, "dbos": self.dbos_db}
        before = {name: self.monitor.transactions(db) for name, db in datnames.items()}
        spent = {name: 0.0 for name in SIDES}
        started = time.monotonic()
        for r in range(self.cfg.rounds):
            for name in SIDES:
                progress(f"{n} agents: {name}, round {r + 1} of {self.cfg.rounds}")
                tag = f"{name}-n{n}-r{r}"
                call = self.theirs(tag) if name == "dbos" else self.ours(tag, name == "inline")
                datname = self.dbos_db if name == "dbos" else self.ledger_db
                at_start = self.monitor.transactions(datname)
                calls = self._round(n, call, datname, sides[name])
                spent[name] += self.monitor.transactions(datname) - at_start
                if name != "dbos":
                    self._breakdown(calls, sides[name])
        time.sleep(self.cfg.stats_wait)
        elapsed = time.monotonic() - started
        # the two opledger paths share a database: each is charged what its rounds were
        # seen to spend, and the stats that came late (`stats_wait`) by those shares
        late: dict[str, float] = {
            name: self.monitor.transactions(db) - before[name] for name, db in datnames.items()
        }
        late["opledger"] -= spent["opledger"] + spent["inline"]
        late["dbos"] -= spent["dbos"]
        ours_spent = spent["opledger"] + spent["inline"] or 1.0
        for name in SIDES:
            db = self.dbos_db if name == "dbos" else self.ledger_db
            share = 1.0 if name == "dbos" else spent[name] / ours_spent
            extra = late["dbos" if name == "dbos" else "opledger"] * share
            idle = self.idle[db] * elapsed * (1.0 if name == "dbos" else share)
            sides[name].xacts = max(0.0, spent[name] + extra - idle)
        summaries = {name: side.summary() for name, side in sides.items()}
        ours, inline, theirs = summaries["opledger"], summaries["inline"], summaries["dbos"]
        return {
            **summaries,
            "ratio_p50": _ratio(ours["p50_ms"], theirs["p50_ms"]),
            "ratio_p99": _ratio(ours["p99_ms"], theirs["p99_ms"]),
            "ratio_effects_s": _ratio(ours["effects_s"], theirs["effects_s"]),
            "inline_ratio_p50": _ratio(inline["p50_ms"], theirs["p50_ms"]),
            "inline_ratio_p99": _ratio(inline["p99_ms"], theirs["p99_ms"]),
            "inline_ratio_effects_s": _ratio(inline["effects_s"], theirs["effects_s"]),
        }

    def _round(
        self, n: int, call: Callable[[int, int], str | None], datname: str, side: _Side
    ) -> list[_Call]:
        """`n` agents calling in a loop: a warm-up, then a timed window; the calls that
        ended in the window (added to `side`)."""
        stop = threading.Event()
        records: list[list[_Call]] = [[] for _ in range(n)]

        def agent(i: int) -> None:
            k = 0
            while not stop.is_set():
                started, wall = time.perf_counter(), time.time()
                try:
                    op_id = call(i, k)
                except Exception as exc:
                    self.errors.append(f"agent {i}, effect {k}: {type(exc).__name__}: {exc}")
                    return  # the run has failed; the others go on to its end
                records[i].append(_Call(started, time.perf_counter(), wall, time.time(), op_id))
                k += 1

        threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(n)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(self.cfg.warmup)
            self.monitor.reset()
            t0 = time.perf_counter()
            time.sleep(self.cfg.seconds)
            t1 = time.perf_counter()
            side.peak = max(side.peak, self.monitor.peak(datname))
        finally:
            stop.set()
            deadline = time.monotonic() + self.cfg.wait + 10
            for thread in threads:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        side.calls += sum(len(agent_calls) for agent_calls in records)
        done = [c for agent_calls in records for c in agent_calls if t0 <= c.ended <= t1]
        side.latencies_ms += [(c.ended - c.started) * 1000 for c in done]
        side.effects += len(done)
        side.seconds += t1 - t0
        return done

    def _breakdown(self, calls: Sequence[_Call], side: _Side) -> None:
        """From each call to the `transitions` row that confirmed its operation, and from
        that row to the call's return."""
        started = {c.op_id: c for c in calls if c.op_id is not None}
        if not started:
            return
        with self.ledger.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT op_id, extract(epoch FROM at) FROM transitions"
                    " WHERE to_status = 'confirmed' AND op_id = ANY(:ids)"
                ),
                {"ids": list(started)},
            ).all()
        for op_id, at in rows:
            c = started[op_id]
            side.to_confirmed_ms.append((float(at) - c.wall_started) * 1000)
            side.to_return_ms.append((c.wall_ended - float(at)) * 1000)


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None}
    ordered = sorted(values)

    def at(q: float) -> float:  # nearest rank
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]

    return {"p50_ms": at(0.50), "p95_ms": at(0.95), "p99_ms": at(0.99)}


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None
