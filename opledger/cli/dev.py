"""Development commands (sandbox, chaos, demo, bench): they run the development tooling
(`opledger.dev`, the `[dev]` and `[sandbox]` extras), which no runtime command imports."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .app import (
    app,
    console,
    missing_extra,
)
from .benchtables import print_agents, print_bench

if TYPE_CHECKING:
    from opledger.adapters.check import FaultProbes
    from opledger.dev.bench import BenchConfig
    from opledger.dev.chaos.run import ChaosConfig, ChaosResult
    from opledger.dev.demo import Row

#: `--json` where the output is one JSON object and nothing else
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


@app.command()
def sandbox(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="HTTP port for the CRM and email APIs (0: any free one).")
    ] = 8025,
    smtp_port: Annotated[int, typer.Option(help="SMTP port (0: any free one).")] = 8026,
) -> None:
    """Run the sandbox CRM, email API and SMTP server until interrupted, by default on the
    ports the bundled adapters' default URLs name (OPLEDGER_CRM_URL, OPLEDGER_EMAIL_URL:
    8025; OPLEDGER_SMTP_PORT: 8026)."""
    try:
        from opledger.dev.sandbox.__main__ import serve
    except ImportError as exc:  # a production install: the servers are an extra
        raise missing_extra("the sandbox", "sandbox", exc.name) from exc

    serve(host, port, smtp_port)


def sandbox_faults(admin_url: str, delay_s: float) -> FaultProbes:
    """The fault probes of `opledger contract check --admin-url`: the sandbox's admin
    routes inject a failure after the change and a restart, and hold each request of the
    concurrency probe `delay_s` seconds."""
    from opledger.dev.faultprobes import SandboxFaults

    return SandboxFaults(admin_url, delay_s=delay_s)


@contextlib.contextmanager
def _interruptible(out: Console, before: Callable[[], None] = lambda: None) -> Iterator[None]:
    """SIGTERM and SIGINT unwind the run inside (every process it started is stopped,
    every temporary file removed); then say so on `out` and exit with 128 + the signal.
    `before` runs first: a live display to stop, so the message is not drawn under it."""
    from opledger.dev.processes import Interrupted, stop_on_signals

    with stop_on_signals():
        try:
            yield
        except Interrupted as stop:
            before()
            out.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
            raise typer.Exit(stop.exit_code) from None


@app.command()
def chaos(
    ops: Annotated[int, typer.Option(help="Operations to drive through the workers.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the breakage schedule.")] = 1,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    fault_rate: Annotated[
        float, typer.Option(help="Share of operations with a provider fault.")
    ] = 0.25,
    kill_every: Annotated[float, typer.Option(help="Mean seconds between worker kills.")] = 2.0,
    redis_restarts: Annotated[
        int, typer.Option(help="Broker restarts (queued messages lost).")
    ] = 1,
    restart_postgres: Annotated[
        bool, typer.Option("--restart-postgres", help="Also restart Postgres (embedded server).")
    ] = False,
    chaos_seconds: Annotated[float, typer.Option(help="How long things keep breaking.")] = 20.0,
    settle_timeout: Annotated[
        float, typer.Option(help="Then how long it may take to settle.")
    ] = 120.0,
    as_json: JsonFlag = False,
    broker: Annotated[
        str,
        typer.Option(
            help="redis (a private server) or rabbitmq (a private vhost on the local "
            "RabbitMQ, made with rabbitmqctl; a restart deletes and re-adds it)."
        ),
    ] = "redis",
) -> None:
    """Drive operations through real workers while killing them, injecting provider faults
    and restarting the broker (and Postgres); then audit duplicates, races, stuck and lost."""
    from opledger.dev.chaos.run import ChaosConfig

    config = ChaosConfig(
        ops=ops,
        seed=seed,
        workers=workers,
        fault_rate=fault_rate,
        kill_every=kill_every,
        redis_restarts=redis_restarts,
        restart_postgres=restart_postgres,
        chaos_seconds=chaos_seconds,
        settle_timeout=settle_timeout,
        broker=broker,
    )
    if broker not in ("redis", "rabbitmq"):
        typer.echo(f"opledger: --broker must be redis or rabbitmq (got {broker!r})", err=True)
        raise typer.Exit(2)
    result = _run_chaos(config, transient=as_json)
    _print_chaos(result.summary(), seed, as_json)
    if not result.clean:
        raise typer.Exit(1)


def _run_chaos(config: ChaosConfig, *, transient: bool) -> ChaosResult:
    """The run behind a progress bar on stderr: operations settled, kills and restarts."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opledger.dev.chaos.run import run_chaos

    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]chaos[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        transient=transient,
    ) as bar:
        task = bar.add_task("settled", total=config.ops, note="")

        def progress(done: int, total: int, counters: dict[str, int]) -> None:
            note = (
                f"kills {counters['kills']} · redis {counters['redis']} · pg {counters['postgres']}"
            )
            bar.update(task, completed=done, total=total, note=note)

        with _interruptible(err):
            result = run_chaos(config, progress=progress)
    return result


def _print_chaos(summary: dict[str, Any], seed: int, as_json: bool) -> None:
    """One JSON object, or a table of the measures and the problems found, in red."""
    if as_json:
        print(json.dumps(summary))
        return
    table = Table("measure", "value", title=f"chaos run, seed {seed}")
    for key, value in summary.items():
        if key != "problems":
            table.add_row(key, str(value))
    console.print(table)
    for problem in summary["problems"]:
        console.print(f"[red]{problem}[/red]")


@app.command()
def demo(
    keep: Annotated[
        bool,
        typer.Option(
            "--keep", help="Leave the stack running, with Flower from the start; print URLs."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Also print a JSON summary.")] = False,
) -> None:
    """The onboarding story, then the same story broken at every crash window."""
    from opledger.dev.demo import run_demo

    started = time.monotonic()
    console.print(
        "[bold]opledger demo[/bold]: an agent closes case-318 in the CRM and emails the "
        "account owner — two operations — on real Postgres, Redis, Celery workers and beat, "
        "and sandbox providers. Then the workers are broken at every crash window.\n"
    )
    screen = _DemoScreen(started)
    with screen.bar, _interruptible(console, before=screen.bar.stop):
        summary = run_demo(keep=keep, on_row=screen.on_row, on_phase=screen.on_phase)
    console.print(screen.table)
    clean = _print_demo_summary(summary, keep, started)
    if as_json:
        print(json.dumps({k: v for k, v in summary.items() if k != "urls"}))
    if not clean:
        raise typer.Exit(1)


class _DemoScreen:
    """What the demo shows while it runs: a progress bar (and, in a log, where no bar is
    live, one line per phase), and the table of scenarios, a row as each one ends."""

    def __init__(self, started: float) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.table import Column

        from opledger.dev.demo import planned_scenarios

        self.started = started
        self.table = Table(
            "scenario", "what was broken", "final status", "provider effects", "review"
        )
        self.bar = Progress(
            SpinnerColumn(),
            TimeElapsedColumn(),
            BarColumn(bar_width=12),
            MofNCompleteColumn(),
            TextColumn(
                "scenarios · {task.description}",
                table_column=Column(no_wrap=True, overflow="ellipsis"),
            ),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=planned_scenarios())

    def on_phase(self, text: str, done: int, total: int) -> None:
        self.bar.update(self.task, description=text, completed=done, total=total)
        if not console.is_terminal:  # no live bar in a log: one line per phase
            console.print(f"[dim]{time.monotonic() - self.started:5.1f}s {text}[/dim]")

    def on_row(self, row: Row) -> None:
        console.print(f"[dim]... {row.scenario}[/dim]")
        self.table.add_row(row.scenario, row.broken, row.outcome, row.effects, row.review)


def _print_demo_summary(summary: dict[str, Any], keep: bool, started: float) -> bool:
    """The audit in one line (green when clean), its problems, what still runs (with
    --keep) and where the same story is told by an agent; whether the run was clean."""
    duplicates = summary["duplicate_effects"]
    style = "green" if duplicates == 0 and not summary["stuck"] and not summary["lost"] else "red"
    console.print(
        f"[{style}]{summary['ops']} operations: {duplicates} duplicate effects, "
        f"{summary['dispatches_while_in_flight']} sends while a call was in flight, "
        f"{summary['stuck']} stuck, {summary['lost']} lost; {summary['unknown_in_review']} "
        f"held for a person to decide.[/{style}]"
    )
    for problem in summary["problems"]:
        console.print(f"[red]{problem}[/red]")
    if keep:
        console.print("\n[bold]Still running[/bold] (Flower saw every task above):")
        for name, url in summary["urls"].items():
            console.print(f"{name}: {url}", soft_wrap=True)
    else:
        console.print(
            f"[dim]{time.monotonic() - started:.0f} s; every process stopped, every temporary "
            "file removed.[/dim]"
        )
    console.print(
        "The same story told by an agent: python -m opledger.examples.langgraph_onboarding "
        "runs it as a LangGraph graph whose thread is killed, replayed and forked without "
        "repeating an effect (docs/agents.md)."
    )
    return style == "green"


#: options of `opledger bench`: the throughput run's lists, and those of --agents
Concurrencies = Annotated[
    str | None,
    typer.Option(help="Concurrencies to measure the ratio at too, e.g. 2,4,8 (0: none)."),
]
Tenants = Annotated[
    str | None,
    typer.Option(help="Tenant counts to spread the ledger's drain over, e.g. 1,10,100 (0: none)."),
]
AgentCounts = Annotated[
    str | None, typer.Option(help="With --agents: concurrent agents, e.g. 1,10,100.")
]
RoundSeconds = Annotated[
    float | None, typer.Option(help="With --agents: seconds of each timed round.")
]
Rounds = Annotated[
    int | None, typer.Option(help="With --agents: timed rounds per side at each count.")
]
Waiters = Annotated[
    int | None,
    typer.Option(help="With --agents: operations per settle drain, and agents waiting."),
]
StatsWait = Annotated[
    float | None,
    typer.Option(
        help="With --agents: seconds idle backends get to report their transactions "
        "before they are counted (default 11: Postgres keeps an idle backend's counts "
        "up to 10 s; less counts fewer)."
    ),
]


@app.command()
def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="A smaller run (under two minutes).")
    ] = False,
    as_json: JsonFlag = False,
    concurrency: Annotated[
        int | None,
        typer.Option(help="Worker processes for every run (default: one per core)."),
    ] = None,
    tasks: Annotated[int | None, typer.Option(help="Tasks per throughput run.")] = None,
    sizes: Annotated[
        str | None, typer.Option(help="Ledger sizes for the sweeps, e.g. 10000,1000000.")
    ] = None,
    prepares: Annotated[int | None, typer.Option(help="Prepares per rate measure.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed sweeps per size.")] = None,
    backlog: Annotated[
        int | None,
        typer.Option(help="Prepared operations in the backlog drains (0: skip them)."),
    ] = None,
    backlog_only: Annotated[
        bool, typer.Option("--backlog-only", help="Only the backlog drains.")
    ] = False,
    backlog_concurrency: Annotated[
        int | None,
        typer.Option(help="Processes in each of the two backlog workers (default 8)."),
    ] = None,
    concurrencies: Concurrencies = None,
    tenants: Tenants = None,
    agents: Annotated[
        bool,
        typer.Option(
            "--agents",
            help="Instead: effect() latency beside DBOS (the bench extra), and many waiters.",
        ),
    ] = False,
    agent_counts: AgentCounts = None,
    round_seconds: RoundSeconds = None,
    rounds: Rounds = None,
    waiters: Waiters = None,
    stats_wait: StatsWait = None,
) -> None:
    """Measure the ledger beside bare Celery (throughput ratio, CPU per operation, round
    trips, sweep cost), and a backlog behind a slow provider drained with and without
    relay and sweep. With --agents: effect() latency beside DBOS Transact's one-step
    workflow, and settles with and without many agents waiting in one process."""
    if agents:
        _bench_agents(
            quick=quick,
            as_json=as_json,
            concurrency=concurrency,
            agent_counts=agent_counts,
            round_seconds=round_seconds,
            rounds=rounds,
            waiters=waiters,
            stats_wait=stats_wait,
        )
        return
    from opledger.dev.bench import run_bench

    config = _bench_config(
        quick=quick,
        concurrency=concurrency,
        tasks=tasks,
        sizes=sizes,
        prepares=prepares,
        repeats=repeats,
        backlog=backlog,
        backlog_only=backlog_only,
        backlog_concurrency=backlog_concurrency,
        concurrencies=concurrencies,
        tenants=tenants,
    )
    err = Console(stderr=True)
    with _interruptible(err):
        result = run_bench(config, progress=lambda m: err.print(f"[dim]{m}[/dim]"))
    if as_json:
        print(json.dumps(result))
        return
    print_bench(result, config.backlog)


def _bench_config(
    *,
    quick: bool,
    concurrency: int | None,
    tasks: int | None,
    sizes: str | None,
    prepares: int | None,
    repeats: int | None,
    backlog: int | None,
    backlog_only: bool,
    concurrencies: str | None,
    tenants: str | None,
    backlog_concurrency: int | None = None,
) -> BenchConfig:
    """The quick or the full run's size, with what the options change: a 0 keeps the
    default, except for --backlog (0: no backlog drains) and in the lists (0: none)."""
    import dataclasses

    from opledger.dev.bench import QUICK, BenchConfig

    config = QUICK if quick else BenchConfig()
    changes: dict[str, Any] = {
        "concurrency": concurrency,
        "tasks": tasks,
        "prepares": prepares,
        "repeats": repeats,
        "backlog_concurrency": backlog_concurrency,
    }
    if sizes:
        two = _counts("--sizes", sizes)
        if len(two) != 2:
            raise typer.BadParameter("give two sizes, small and large, e.g. 10000,1000000")
        changes["sizes"] = (two[0], two[1])
    if concurrencies is not None:
        changes["concurrencies"] = tuple(c for c in _counts("--concurrencies", concurrencies) if c)
    if tenants is not None:
        changes["tenants"] = tuple(t for t in _counts("--tenants", tenants) if t)
    config = dataclasses.replace(
        config, **{k: v for k, v in changes.items() if v is not None and v != 0}
    )
    if backlog is not None:
        config = dataclasses.replace(config, backlog=backlog)
    return dataclasses.replace(config, backlog_only=backlog_only)


def _bench_agents(
    *,
    quick: bool,
    as_json: bool,
    concurrency: int | None,
    agent_counts: str | None,
    round_seconds: float | None,
    rounds: int | None,
    waiters: int | None,
    stats_wait: float | None,
) -> None:
    """`opledger bench --agents`: one JSON object or a table; exit 1 if any effect or
    waiter was not answered confirmed."""
    import dataclasses

    from opledger.dev.bench import AGENTS_QUICK, AgentsConfig

    try:
        import opledger.dev.bench.agents_dbos  # noqa: F401 - DBOS itself, which run_agents imports late
        from opledger.dev.bench.agents import run_agents
    except ImportError as exc:  # DBOS is in the bench extra
        raise missing_extra("the agents bench", "bench", exc.name) from exc
    config = AGENTS_QUICK if quick else AgentsConfig()
    changes: dict[str, Any] = {
        "concurrency": concurrency,
        "seconds": round_seconds,
        "rounds": rounds,
        "waiters": waiters,
        "stats_wait": stats_wait,
    }
    config = dataclasses.replace(
        config, **{k: v for k, v in changes.items() if v is not None and v > 0}
    )
    if agent_counts is not None:
        counts = tuple(c for c in _counts("--agent-counts", agent_counts) if c)
        if not counts:
            raise typer.BadParameter("--agent-counts needs at least one count above 0")
        config = dataclasses.replace(config, agent_counts=counts)
    if config.seconds > 10 * 60 or config.waiters > 100_000:
        raise typer.BadParameter("a round of at most 600 s, at most 100000 waiters")
    err = Console(stderr=True)
    with _interruptible(err):
        result = run_agents(config, progress=lambda m: err.print(f"[dim]{m}[/dim]"))
    if as_json:
        print(json.dumps(result))
    else:
        print_agents(result)
    if result["errors_count"]:
        if not as_json:
            for line in result["errors"][:10]:
                console.print(line, style="red", markup=False)
        raise typer.Exit(1)


def _counts(option: str, text: str) -> list[int]:
    """A comma-separated list of non-negative whole numbers, or a usage error."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} takes whole numbers separated by commas") from None
    if not values or any(v < 0 for v in values):
        raise typer.BadParameter(f"{option} takes whole numbers separated by commas")
    return values
