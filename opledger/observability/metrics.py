"""The workers' counters and histograms, multiprocess-safe for Celery's prefork pool.

They count only when `prometheus_client` is installed (the `[metrics]` extra) and
`PROMETHEUS_MULTIPROC_DIR` names a directory (shared by the workers and `opledger
metrics`, emptied before the workers start): each process writes its own file there and
the metrics endpoint adds them up, so a counter of a killed worker is not lost. Otherwise
every metric is a no-op: one method call per event, nothing else.

Nothing here touches the database: what the ledger knows (operations by status, open
reviews, oldest ages) is read at scrape time by `ledger_gauges`.
"""

from __future__ import annotations

import os
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: provider call latency buckets (seconds): fast APIs to a provider at its timeout
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SWEEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _Noop:
    """A metric that counts nothing (no extra, or no multiprocess directory)."""

    def labels(self, *_: Any, **__: Any) -> _Noop:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


def enabled() -> bool:
    """Whether this process counts (the extra is installed and the directory is set)."""
    if not os.environ.get(MULTIPROC_ENV):
        return False
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def _build() -> dict[str, Any]:
    if not enabled():
        noop = _Noop()
        return dict.fromkeys(
            ("decisions", "outcomes", "fenced", "relayed", "sweep", "latency", "mcp"), noop
        )
    from prometheus_client import Counter, Histogram

    return {
        "decisions": Counter(
            "opledger_decisions",
            "Retry decisions taken by reconcile, by kind.",
            ["kind"],
        ),
        "outcomes": Counter(
            "opledger_dispatch_outcomes",
            "Provider calls' outcomes as recorded, by provider and kind "
            "(confirmed, rejected, ambiguous).",
            ["provider", "kind"],
        ),
        "fenced": Counter(
            "opledger_fenced_out_writes",
            "Writes refused because another claim moved the operation first (by step).",
            ["step"],
        ),
        "relayed": Counter(
            "opledger_relay_republished",
            "Prepared operations the relay published again (their message plausibly lost).",
        ),
        "sweep": Histogram(
            "opledger_sweep_duration_seconds",
            "How long one sweep took.",
            buckets=SWEEP_BUCKETS,
        ),
        "latency": Histogram(
            "opledger_provider_call_seconds",
            "Provider call latency (the dispatch call, from send to answer), by provider.",
            ["provider"],
            buckets=LATENCY_BUCKETS,
        ),
        "mcp": Counter(
            "opledger_mcp_calls",
            "MCP gateway tool calls answered, by tool and kind (confirmed, rejected, "
            "cancelled, unknown, pending, refused).",
            ["tool", "kind"],
        ),
    }


_metrics = _build()
DECISIONS = _metrics["decisions"]
DISPATCH_OUTCOMES = _metrics["outcomes"]
FENCED_OUT = _metrics["fenced"]
RELAY_REPUBLISHED = _metrics["relayed"]
SWEEP_DURATION = _metrics["sweep"]
PROVIDER_LATENCY = _metrics["latency"]
MCP_CALLS = _metrics["mcp"]
