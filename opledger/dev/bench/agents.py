"""`opledger bench --agents`: what an agent feels when it waits on an effect, beside DBOS
Transact on the same Postgres server, in one run; and what many waiting agents cost.

Part 1, effect() latency. Agents are threads of the bench process; each one loops on an
effect and waits for its answer. opledger: `Effects.effect(..., wait=)` on the instant
adapter (`bench.noop.v1`, no network), dispatched by an `opledger worker`; every answer
must be an `EffectConfirmed`. DBOS: one workflow per effect with one step calling the same
instant provider, run in the agent's thread under `SetWorkflowID` (the same kind of id as
opledger's run and intent key), on a database of its own on the same server. Both are
durable as shipped (the server's synchronous_commit). At each agent count, timed rounds of
the two sides alternate (opledger, DBOS, opledger, DBOS...), each after a warm-up by the
same agents; the latencies of a side are pooled over its rounds.

Part 2, the settle's NOTIFY and many waiters in one process. M operations drained by the
worker with nobody waiting (not watched: no NOTIFY), then M watched operations (`notify=`)
drained while M asyncio agents in the bench process, one event loop, each await one of
them (`Effects.await_result`), all of them parked before the first publish. The two
alternate. Timed from the first publish to the last confirmation.

The JSON (`opledger bench --agents --json`):

- `agent_counts`, `seconds`, `rounds`, `concurrency`: the run's size;
- `by_agents`: by agent count (a string), `opledger` and `dbos`, each with `p50_ms`,
  `p95_ms`, `p99_ms` (effect() call to answer), `effects` (answers within the timed
  rounds), `effects_s`, `xacts_per_effect` (the side's database's committed and rolled back
  transactions per effect over all its calls at that count, warm-ups included: for
  opledger the worker's and the bench process's alike; what the side does while idle, at
  the rate `idle_xacts_s` measured before part 1, taken out), `peak_connections` (the most
  client connections to the side's database seen during a round); opledger also
  `start_to_confirmed_ms` and `confirmed_to_return_ms` (medians: from the call to the
  `transitions` row that confirmed it, and from that row to the call's return; wall clocks
  of the same machine); and `ratio_p50`, `ratio_p99` (opledger / DBOS: at most 1.0 is as
  fast or faster) and `ratio_effects_s` (opledger / DBOS: at least 1.0 is as many or more);
- `idle_xacts_s`: `opledger` and `dbos`, each database's transactions per second with
  nothing to do (the worker's, DBOS's own pollers);
- `settles`: `ops` (M), `without_s` and `with_s` (each drain's seconds), `settles_s_without`,
  `settles_s_with` (M over the pooled seconds), `ratio` (with / without), `waiters_answered`
  (the fewest confirmed answers of a drain with waiters, out of M), `waiters_ready_s` (the
  longest it took the M waiters to park), `waiting_connections_peak` (the most Postgres
  connections the bench process held for waiting, beside the ledger's pool: see
  `WORKER_NAME`);
- `errors`: what went wrong, a line each (none in a good run: `errors_count` is 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url

from opledger.agents import EffectConfirmed, Effects
from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, Stack, use_broker, wait_until
from opledger.ledger import Ledger
from opledger.ledger.pgschema import search_path
from opledger.settings import Settings

from .apps import ACTION, build_registry
from .config import AgentsConfig
from .run import _rounded, worker_env
from .throughput import _empty_ledger, _Poll, prepare_many

#: Every connection of the run to the ledger's database carries one of these names but the
#: bench process's waiting ones: the worker's (its database URL names it), the ledger pool's
#: in the bench process (set as each connection is opened) and the drain's poll. The bench
#: process's connections for waiting are then those left (whatever else names them: the
#: listener's own connection, or one per waiting agent).
WORKER_NAME = "opledger-bench-worker"
POOL_NAME = "opledger-bench-pool"
POLL_NAME = "opledger-bench-poll"
MONITOR_NAME = "opledger-bench-monitor"
LABELLED = (WORKER_NAME, POOL_NAME, POLL_NAME, MONITOR_NAME)
#: how often the monitor samples pg_stat_activity
SAMPLE_EVERY = 0.2
#: the waiters are parked once the ledger's pool has run no statement for this long
QUIET_S = 0.5
#: how long the idle rate of transactions is measured for
IDLE_RATE_S = 5.0


def run_agents(
    cfg: AgentsConfig, *, progress: Callable[[str], None] = lambda _m: None
) -> dict[str, Any]:
    """Both parts; every process it starts is stopped, every database it makes dropped."""
    from opledger.tasks.app import app

    from .agents_dbos import DbosSide  # the bench extra, only for this run

    with contextlib.ExitStack() as cleanup:
        work = Path(tempfile.mkdtemp(prefix="opledger-bench-agents-"))
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        server_url = devstack.postgres_url()
        url, drop = devstack.scratch_database(server_url, "opledger_agents")
        cleanup.callback(drop)
        # empty: DBOS makes its own schema in it
        dbos_url, drop_dbos = devstack.scratch_database(
            server_url, "opledger_agents_dbos", migrate=False
        )
        cleanup.callback(drop_dbos)
        redis = PrivateRedis(work)
        cleanup.callback(redis.kill)
        redis.start()
        env = worker_env(_named(url, WORKER_NAME), redis.url, work)
        stack = Stack(env, work, name="agents")
        cleanup.callback(stack.stop_all)
        use_broker(app, redis.url)
        ledger = Ledger.from_url(url, actions=build_registry(Settings.from_environ(env)))
        cleanup.callback(ledger.engine.dispose)
        _name_connections(ledger.engine, POOL_NAME)
        # the databases are dropped under the settle listener at the end: not a warning
        cleanup.callback(logging.getLogger("opledger.agents").setLevel, logging.ERROR)
        ledger.grant(tenant="bench", scope=["bench.*"], granted_by="bench", ref="auth_bench")
        effects = Effects(ledger)
        ledger_db, dbos_db = make_url(url).database, make_url(dbos_url).database
        assert ledger_db is not None and dbos_db is not None
        monitor = _Monitor(server_url, ledger_db, dbos_db)
        cleanup.callback(monitor.stop)
        progress(f"starting an opledger worker ({cfg.concurrency} processes) and DBOS")
        stack.start_worker("agents", concurrency=cfg.concurrency)
        dbos = DbosSide(dbos_url)
        cleanup.callback(dbos.close)
        errors: list[str] = []
        result: dict[str, Any] = {
            "agent_counts": list(cfg.agent_counts),
            "seconds": cfg.seconds,
            "rounds": cfg.rounds,
            "concurrency": cfg.concurrency,
        }
        sides = _Sides(cfg, effects, dbos, ledger, monitor, ledger_db, dbos_db, errors)
        progress("the two databases' transactions with nothing to do")
        result["idle_xacts_s"] = sides.idle_rates()
        result["by_agents"] = {str(n): sides.at(n, progress) for n in cfg.agent_counts if n > 0}
        progress(f"settles: {cfg.waiters} operations without waiters, then with")
        result["settles"] = _settles(cfg, effects, ledger, monitor, ledger_db, errors)
        result["errors"] = errors
        result["errors_count"] = len(errors)
        rounded: dict[str, Any] = _rounded(result)
        return rounded
    raise AssertionError("unreachable")  # pragma: no cover


# -- set-up ---------------------------------------------------------------------------


def _libpq(url: str, **query: str) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if query:
        parsed = parsed.update_query_dict(query)
    return parsed.render_as_string(hide_password=False)


def _named(url: str, name: str) -> str:
    """`url` whose connections name themselves `name` (pg_stat_activity.application_name)."""
    return (
        make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


def _name_connections(engine: Engine, name: str) -> None:
    """Every connection `engine` opens from now on names itself `name` (the URL stays as it
    was: what is derived from it, the settle listener's connection, is not named)."""

    def named(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
        params["application_name"] = name

    event.listen(engine, "do_connect", named)
    engine.dispose()  # none opened before is left unnamed


class _Monitor:
    """Client connections to the run's databases, sampled every SAMPLE_EVERY seconds from
    a connection to the server's own database (so it counts in neither); the most seen
    since `reset()`. Also reads a database's transaction count."""

    def __init__(self, server_url: str, *datnames: str) -> None:
        self.datnames = list(datnames)
        self.conn = psycopg.connect(
            _libpq(server_url), autocommit=True, application_name=MONITOR_NAME
        )
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(SAMPLE_EVERY):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            rows = self.conn.execute(
                "SELECT datname, application_name, count(*) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND datname = ANY(%s)"
                " GROUP BY datname, application_name",
                [self.datnames],
            ).fetchall()
            counts: dict[str, int] = {}
            for datname, name, n in rows:
                counts[datname] = counts.get(datname, 0) + n
                if name not in LABELLED:
                    counts[f"waiting:{datname}"] = counts.get(f"waiting:{datname}", 0) + n
            for key, n in counts.items():
                self._peaks[key] = max(self._peaks.get(key, 0), n)

    def reset(self) -> None:
        with self._lock:
            self._peaks = {}
        self.sample()

    def peak(self, datname: str) -> int:
        """The most client connections to `datname` seen since `reset()`."""
        self.sample()
        with self._lock:
            return self._peaks.get(datname, 0)

    def peak_waiting(self, datname: str) -> int:
        """The most connections to `datname` seen since `reset()` that none of the run's
        names claims: the bench process's connections for waiting."""
        self.sample()
        with self._lock:
            return self._peaks.get(f"waiting:{datname}", 0)

    def transactions(self, datname: str) -> int:
        """Committed and rolled back transactions of `datname` so far (as reported)."""
        with self._lock:
            self.conn.execute("SELECT pg_stat_clear_snapshot()")
            row = self.conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                [datname],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self.conn.close()


# -- part 1: effect() latency -----------------------------------------------------------


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


class _Sides:
    """Part 1: the two sides' interleaved rounds at each agent count."""

    def __init__(
        self,
        cfg: AgentsConfig,
        effects: Effects,
        dbos: Any,
        ledger: Ledger,
        monitor: _Monitor,
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

    def idle_rates(self) -> dict[str, float]:
        """Each database's transactions per second with nothing to do, once every backend
        reported what it did (which part 1 then subtracts); `opledger` and `dbos`."""
        time.sleep(self.cfg.stats_wait)
        before = {db: self.monitor.transactions(db) for db in self.idle}
        time.sleep(IDLE_RATE_S)
        for db in self.idle:
            self.idle[db] = (self.monitor.transactions(db) - before[db]) / IDLE_RATE_S
        return {"opledger": self.idle[self.ledger_db], "dbos": self.idle[self.dbos_db]}

    def ours(self, tag: str) -> Callable[[int, int], str | None]:
        def call(i: int, k: int) -> str | None:
            result = self.effects.effect(
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
        sides = {"opledger": _Side(), "dbos": _Side()}
        # every backend has reported what it did before (idle_rates, or the previous
        # count's end): the transactions from here to the end are this count's
        datnames = {"opledger": self.ledger_db, "dbos": self.dbos_db}
        before = {name: self.monitor.transactions(db) for name, db in datnames.items()}
        started = time.monotonic()
        for r in range(self.cfg.rounds):
            for name in ("opledger", "dbos"):
                progress(f"{n} agents: {name}, round {r + 1} of {self.cfg.rounds}")
                tag = f"{name}-n{n}-r{r}"
                call = self.ours(tag) if name == "opledger" else self.theirs(tag)
                datname = self.ledger_db if name == "opledger" else self.dbos_db
                calls = self._round(n, call, datname, sides[name])
                if name == "opledger":
                    self._breakdown(calls, sides[name])
        time.sleep(self.cfg.stats_wait)
        elapsed = time.monotonic() - started
        for name, db in datnames.items():
            spent = self.monitor.transactions(db) - before[name]
            sides[name].xacts = max(0.0, spent - self.idle[db] * elapsed)
        ours, theirs = sides["opledger"].summary(), sides["dbos"].summary()
        return {
            "opledger": ours,
            "dbos": theirs,
            "ratio_p50": _ratio(ours["p50_ms"], theirs["p50_ms"]),
            "ratio_p99": _ratio(ours["p99_ms"], theirs["p99_ms"]),
            "ratio_effects_s": _ratio(ours["effects_s"], theirs["effects_s"]),
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


# -- part 2: settles with and without waiters ---------------------------------------------


def _settles(
    cfg: AgentsConfig,
    effects: Effects,
    ledger: Ledger,
    monitor: _Monitor,
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
        _libpq(ledger.engine.url.render_as_string(hide_password=False)),
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
