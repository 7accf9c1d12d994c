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
