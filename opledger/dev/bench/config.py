"""How big a bench run is (`QUICK`: the smoke-sized one)."""

from __future__ import annotations

import os
from dataclasses import dataclass


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


@dataclass
class AgentsConfig:
    """How big `opledger bench --agents` is."""

    #: concurrent agents (threads in the bench process) in part 1, one count after another
    agent_counts: tuple[int, ...] = (1, 10, 100)
    seconds: float = 3.0  #: each timed round
    warmup: float = 1.0  #: before each round, the same agents, untimed
    #: timed rounds per side at each count, interleaved with the other side's: this shared
    #: machine's speed drifts by a quarter within minutes, so short rounds, many times
    rounds: int = 4
    #: processes of the opledger worker: as `opledger worker` starts by default, one per core
    concurrency: int = os.cpu_count() or 2
    wait: float = 30.0  #: what each `effect(..., wait=)` waits at most
    #: part 2: operations settled per drain, and in the drains with waiters as many agents
    #: waiting (one on each) from the bench process
    waiters: int = 1_000
    settle_rounds: int = 2  #: drains without waiters and with, interleaved (pairs)
    #: how long every backend is left idle before the transactions are counted: Postgres
    #: 15 keeps an idle backend's counts up to 10 s (less counts fewer)
    stats_wait: float = 11.0


AGENTS_QUICK = AgentsConfig(seconds=1.5, warmup=0.5, rounds=2, waiters=300, settle_rounds=1)
