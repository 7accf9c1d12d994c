"""`opledger bench` (`run`): the ledger's cost measured beside bare Celery, in one run.
Its rooms: `apps` (what the workers run), `config`, `cpu`, `throughput`, `sweep`,
`backlog`. The workers it starts name `opledger.dev.bench:bare` and
`opledger.dev.bench:build_registry`."""

from .apps import bare, build_registry
from .config import QUICK, BenchConfig
from .run import run_bench

__all__ = ["QUICK", "BenchConfig", "bare", "build_registry", "run_bench"]
