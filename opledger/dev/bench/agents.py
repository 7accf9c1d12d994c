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
  `agents_monitor.WORKER_NAME`);
- `errors`: what went wrong, a line each (none in a good run: `errors_count` is 0).

This module runs both; the parts: `agents_latency` (part 1), `agents_settles` (part 2),
`agents_monitor` (the run's connections, named and counted), `agents_dbos` (DBOS's side).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from opledger.agents import Effects
from opledger.dev import devstack
from opledger.dev.processes import PrivateRedis, Stack, use_broker
from opledger.ledger import Ledger
from opledger.settings import Settings

from .agents_latency import Sides
from .agents_monitor import POOL_NAME, WORKER_NAME, Monitor, name_connections, named
from .agents_settles import settles
from .apps import build_registry
from .config import AgentsConfig
from .run import _rounded, worker_env


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
        env = worker_env(named(url, WORKER_NAME), redis.url, work)
        stack = Stack(env, work, name="agents")
        cleanup.callback(stack.stop_all)
        use_broker(app, redis.url)
        settings = Settings.from_environ(env)
        ledger = Ledger.from_url(url, actions=build_registry(settings), **settings.ledger_options())
        cleanup.callback(ledger.engine.dispose)
        name_connections(ledger.engine, POOL_NAME)
        # the databases are dropped under the settle listener at the end: not a warning
        cleanup.callback(logging.getLogger("opledger.agents").setLevel, logging.ERROR)
        ledger.grant(tenant="bench", scope=["bench.*"], granted_by="bench", ref="auth_bench")
        effects = Effects(ledger)
        ledger_db, dbos_db = make_url(url).database, make_url(dbos_url).database
        assert ledger_db is not None and dbos_db is not None
        monitor = Monitor(server_url, ledger_db, dbos_db)
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
        sides = Sides(cfg, effects, dbos, ledger, monitor, ledger_db, dbos_db, errors)
        progress("the two databases' transactions with nothing to do")
        result["idle_xacts_s"] = sides.idle_rates()
        result["by_agents"] = {str(n): sides.at(n, progress) for n in cfg.agent_counts if n > 0}
        progress(f"settles: {cfg.waiters} operations without waiters, then with")
        result["settles"] = settles(cfg, effects, ledger, monitor, ledger_db, errors)
        result["errors"] = errors
        result["errors_count"] = len(errors)
        rounded: dict[str, Any] = _rounded(result)
        return rounded
    raise AssertionError("unreachable")  # pragma: no cover
