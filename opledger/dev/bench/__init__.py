"""`opledger bench` (`run`): the ledger's cost measured beside bare Celery, in one run;
`opledger bench --agents` (`agents`): effect() latency beside DBOS Transact, and many
waiting agents. Its rooms: `apps` (what the workers run), `config`, `cpu`, `throughput`,
`sweep`, `backlog`, `agents` and `agents_dbos` (neither imported here: the workers import
this package, and DBOS is imported only when that bench runs). The workers it starts name
`opledger.dev.bench:bare` and `opledger.dev.bench:build_registry`."""

from .apps import bare, build_registry
from .config import AGENTS_QUICK, QUICK, AgentsConfig, BenchConfig
from .run import run_bench

__all__ = [
    "AGENTS_QUICK",
    "QUICK",
    "AgentsConfig",
    "BenchConfig",
    "bare",
    "build_registry",
    "run_bench",
]
