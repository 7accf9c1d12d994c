"""The tables `opledger bench` prints: its measures beside their targets, and the agents
bench's sides and ratios."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from .app import console


def print_bench(result: dict[str, Any], backlog: int) -> None:
    """A table of the measures beside their targets (`backlog`: the operations the backlog
    drain settles), then the sweeps' query plans."""
    table = Table("measure", "value", "target")
    targets = {
        "backlog_ratio": ">= 0.9",
        "pressure_ratio": ">= 0.9",
        "backlog_msgs_per_op_max": "<= 1.5",
        "backlog_wipe_settled": f"= {backlog}",
        "ratio": ">= 0.8",
        "round_trips_per_op": "<= 2",
    }
    if "sweep_ms_10k" in result:  # the sweeps ran (not with --backlog-only)
        targets["sweep_ms_1m"] = f"<= 2 x sweep_ms_10k = {2 * result['sweep_ms_10k']:.1f}"
    for key, value in result.items():
        if key in ("by_concurrency", "ledger_ops_s_by_tenants"):
            continue
        if key != "sweep_plans":
            table.add_row(key, str(value), targets.get(key, ""))
    for c, row in result.get("by_concurrency", {}).items():
        table.add_row(f"ratio at concurrency {c}", str(row["ratio"]), ">= 0.8")
    for t, ops in result.get("ledger_ops_s_by_tenants", {}).items():
        table.add_row(f"ledger_ops_s with {t} tenants", str(ops), "")
    console.print(table)
    for size, plans in result.get("sweep_plans", {}).items():
        for name, plan in plans.items():
            console.print(f"[dim]{size} {name}: {plan}[/dim]")


def print_agents(result: dict[str, Any]) -> None:
    """Each agent count's two sides and ratios, then the settles, beside the targets."""
    table = Table(
        "agents",
        "side",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "effects/s",
        "xacts/effect",
        "peak conns",
        "call→confirmed ms",
        "confirmed→return ms",
        title="effect() latency, opledger beside DBOS (one run, rounds interleaved)",
    )
    for n, row in result["by_agents"].items():
        for side in ("opledger", "inline", "dbos"):
            r = row[side]
            table.add_row(
                n,
                side,
                *(
                    cell(r.get(k))
                    for k in (
                        "p50_ms",
                        "p95_ms",
                        "p99_ms",
                        "effects_s",
                        "xacts_per_effect",
                        "peak_connections",
                        "start_to_confirmed_ms",
                        "confirmed_to_return_ms",
                    )
                ),
            )
    console.print(table)
    ratios = Table("measure", "value", "target")
    for n, row in result["by_agents"].items():
        target_time = "<= 1.0" if n == "10" else ""
        ratios.add_row(
            f"p50 ratio at {n} agents (opledger/DBOS)", cell(row["ratio_p50"]), target_time
        )
        ratios.add_row(
            f"p99 ratio at {n} agents (opledger/DBOS)", cell(row["ratio_p99"]), target_time
        )
        ratios.add_row(
            f"effects/s ratio at {n} agents (opledger/DBOS)",
            cell(row["ratio_effects_s"]),
            ">= 1.0" if n == "100" else "",
        )
    for n, row in result["by_agents"].items():  # the inline path's targets
        ratios.add_row(
            f"p50 ratio at {n} agents (inline/DBOS)",
            cell(row["inline_ratio_p50"]),
            "<= 0.8" if n in ("1", "10") else "",
        )
        ratios.add_row(
            f"effects/s ratio at {n} agents (inline/DBOS)",
            cell(row["inline_ratio_effects_s"]),
            ">= 1.2" if n in ("10", "100") else "",
        )
    settles = result["settles"]
    ratios.add_row("settles/s without waiters", cell(settles["settles_s_without"]), "")
    ratios.add_row(f"settles/s with {settles['ops']} waiters", cell(settles["settles_s_with"]), "")
    ratios.add_row("settles ratio (with/without)", cell(settles["ratio"]), ">= 0.9")
    ratios.add_row(
        "waiters answered confirmed", cell(settles["waiters_answered"]), f"= {settles['ops']}"
    )
    ratios.add_row("seconds for the waiters to park", cell(settles["waiters_ready_s"]), "")
    ratios.add_row(
        "peak connections for waiting", cell(settles["waiting_connections_peak"]), "<= 2"
    )
    ratios.add_row("errors", str(result["errors_count"]), "= 0")
    console.print(ratios)


def cell(value: Any) -> str:
    return "-" if value is None else str(value)
