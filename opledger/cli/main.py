"""The `opledger` command: the composition root that wires the ledger, adapters and tasks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from opledger.adapters.registry import load_registry
from opledger.dev import devstack
from opledger.ledger import History, Ledger, LedgerError, Operation, Resolution, Status
from opledger.ledger.consequences import contract_facts
from opledger.ledger.migrate import upgrade
from opledger.settings import get_settings

app = typer.Typer(
    help="opledger: external side effects that happen once, or say they may not have."
)
ops_app = typer.Typer(help="Inspect operations.")
app.add_typer(ops_app, name="ops")
review_app = typer.Typer(help="The operator review queue: what no evidence could decide.")
app.add_typer(review_app, name="review")
contract_app = typer.Typer(help="Provider contracts: what each adapter declares, checked.")
app.add_typer(contract_app, name="contract")
console = Console()


def database_url() -> str:
    """The configured ledger database, or the development one devstack finds or starts."""
    return get_settings().database_url or devstack.ledger_database_url()


def ensure_services() -> None:
    """Before starting Celery processes: make the database and broker URLs explicit (an
    embedded Postgres or Redis is started when nothing is configured or answering), so
    every child process and the Celery config see the same ones."""
    os.environ["OPLEDGER_DATABASE_URL"] = database_url()
    if not get_settings().broker_url:
        os.environ["OPLEDGER_BROKER_URL"] = devstack.redis_url()
    get_settings.cache_clear()


@contextmanager
def open_ledger() -> Iterator[Ledger]:
    """The ledger, wired to the configured adapters (for their contracts); its connections
    are closed on exit."""
    settings = get_settings()
    ledger = Ledger.from_url(
        database_url(),
        actions=load_registry(settings),
        max_payload_bytes=settings.max_payload_bytes,
        pool_size=1,
    )
    try:
        yield ledger
    finally:
        ledger.engine.dispose()


@app.command()
def migrate() -> None:
    """Apply the ledger's migrations to the configured database."""
    upgrade(database_url())
    console.print("[green]ledger schema is at head[/green]")


def _when(value: object) -> str:
    return "" if value is None else str(value)[:23]


def operations_table(operations: tuple[Operation, ...]) -> Table:
    table = Table()
    table.add_column("id", no_wrap=True)
    for column in ("tenant", "action", "target", "status", "fence", "updated"):
        table.add_column(column)
    for op in operations:
        table.add_row(
            op.id,
            op.tenant,
            op.action,
            op.target,
            op.status.value,
            str(op.fence),
            _when(op.updated_at),
        )
    return table


def history_tables(history: History) -> list[Table]:
    op = history.operation
    summary = Table("field", "value", title=f"operation {op.id}")
    for name in (
        "status",
        "tenant",
        "workflow_id",
        "intent_key",
        "action",
        "target",
        "provider",
        "payload_digest",
        "authorization_ref",
        "fence",
        "idempotency_key",
        "provider_result_id",
        "lease_owner",
        "lease_expires_at",
        "next_check_at",
        "created_at",
        "updated_at",
    ):
        value = getattr(op, name)
        summary.add_row(name, "" if value is None else str(value))
    attempts = Table(
        "n", "fence", "owner", "key", "started", "deadline", "finished", "outcome", title="attempts"
    )
    for a in history.attempts:
        attempts.add_row(
            str(a.n),
            str(a.fence),
            a.owner,
            a.idempotency_key,
            _when(a.started_at),
            _when(a.deadline_at),
            _when(a.finished_at),
            a.outcome or "",
        )
    evidence = Table("at", "source", "verdict", "applied", "binding", "detail", title="evidence")
    for e in history.evidence:
        evidence.add_row(
            _when(e.recorded_at),
            e.source,
            e.verdict,
            "yes" if e.applied else "no (kept)",
            e.binding.model_dump_json(exclude_none=True),
            str(e.detail)[:80],
        )
    transitions = Table("at", "from", "to", "fence", "by", "reason", title="transitions")
    for t in history.transitions:
        transitions.add_row(
            _when(t.at),
            t.from_status.value if t.from_status else "",
            t.to_status.value,
            str(t.fence),
            t.actor,
            t.reason,
        )
    return [summary, attempts, evidence, transitions]


@ops_app.command("show")
def ops_show(op_id: str) -> None:
    """Status, attempts, evidence and transitions of one operation."""
    try:
        with open_ledger() as ledger:
            history = ledger.history(op_id)
    except LedgerError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    for table in history_tables(history):
        console.print(table)


@ops_app.command("list")
def ops_list(
    status: Annotated[list[Status] | None, typer.Option(help="Only these statuses.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
) -> None:
    """Operations, newest first."""
    try:
        with open_ledger() as ledger:
            operations = ledger.list(status=status, tenant=tenant, limit=limit)
    except LedgerError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    console.print(operations_table(operations))


def parse_age(text: str) -> timedelta:
    """'90s', '15m', '2h', '3d' -> timedelta."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return timedelta(seconds=float(text[:-1]) * units[text[-1]])
    except (KeyError, ValueError, IndexError):
        raise typer.BadParameter(f"{text!r}: use a number and s, m, h or d (e.g. 2h)") from None


TenantOption = Annotated[str, typer.Option(help="The tenant you act for (required).")]
OperatorOption = Annotated[str, typer.Option(help="Your name, for the audit trail.")]


@review_app.command("list")
def review_list(
    tenant: TenantOption,
    older_than: Annotated[
        str | None, typer.Option(help="Only reviews older than, e.g. 2h.")
    ] = None,
    action: Annotated[str | None, typer.Option(help="An action, or a prefix ending in *.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, oldest first.")] = 100,
) -> None:
    """Open reviews of one tenant, oldest first."""
    try:
        with open_ledger() as ledger:
            rows = ledger.reviews.list(
                tenant=tenant,
                older_than=parse_age(older_than) if older_than else None,
                action=action,
                limit=limit,
            )
    except LedgerError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    table = Table(title=f"open reviews of {tenant}")
    table.add_column("op", no_wrap=True)
    for column in ("action", "target", "opened", "reason"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.op_id, r.action, r.target, _when(r.opened_at), r.reason)
    console.print(table)


@review_app.command("show")
def review_show(op_id: str, tenant: TenantOption, operator: OperatorOption) -> None:
    """What was attempted, the evidence, and what each resolution could cause.

    Recorded as your latest view: a resolution is checked against it.
    """
    try:
        with open_ledger() as ledger:
            view = ledger.reviews.show(op_id, tenant=tenant, operator=operator)
    except LedgerError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    console.print(f"[bold]review of {op_id}[/bold] opened {_when(view.review.opened_at)}")
    console.print(f"reason: {view.review.reason}")
    history = History(
        operation=view.operation,
        attempts=view.attempts,
        evidence=view.evidence,
        transitions=(),
        reviews=(view.review,),
    )
    for table in history_tables(history)[:3]:
        console.print(table)
    if view.contract is not None:
        console.print(f"provider contract: {view.contract.provider}")
        for fact in contract_facts(view.contract):
            console.print(f"  - {fact}")
    hint = view.review.snapshot.get("search_hint")
    if hint:
        console.print(f"to check by hand: {hint}")
    effects = Table("resolution", "what it could cause", title="consequences")
    if view.consequences is None:
        effects.add_row("all", "no adapter contract is known for this action: judge with care")
    else:
        e = view.consequences
        effects.add_row("confirmed", e.confirmed)
        effects.add_row("rejected", e.rejected)
        no_dedup = view.contract is not None and view.contract.idempotency.kind == "none"
        effects.add_row("retry --accept-risk" if no_dedup else "retry", e.retry)
        if not no_dedup:
            effects.add_row("retry --new-key", e.retry_new_key)
        effects.add_row("cancel", e.cancel)
    console.print(effects)
    console.print(f"shown to {operator} at version {view.operation.record_version}")


@review_app.command("resolve")
def review_resolve(
    op_id: str,
    tenant: TenantOption,
    operator: OperatorOption,
    as_: Annotated[Resolution, typer.Option("--as", help="confirmed, rejected, retry or cancel.")],
    note: Annotated[str, typer.Option(help="Why: kept in the audit trail.")],
    evidence: Annotated[str | None, typer.Option(help="What you checked, if anything.")] = None,
    new_key: Annotated[
        bool, typer.Option("--new-key", help="Retry with a new key, accepting the risk shown.")
    ] = False,
    accept_risk: Annotated[
        bool,
        typer.Option(
            "--accept-risk",
            help="Retry although the provider does not deduplicate: the effect may repeat.",
        ),
    ] = False,
    override_evidence: Annotated[
        bool,
        typer.Option(
            "--override-evidence",
            help="Resolve against evidence on record that binds this operation (audited).",
        ),
    ] = False,
) -> None:
    """Settle a review you were shown: a fenced transition plus an audit row."""
    try:
        with open_ledger() as ledger:
            after = ledger.reviews.resolve(
                op_id,
                tenant=tenant,
                operator=operator,
                resolution=as_,
                note=note,
                evidence=evidence,
                new_key=new_key,
                acknowledge_risk=accept_risk,
                override_evidence=override_evidence,
            )
    except LedgerError as exc:
        console.print(f"[red]refused: {exc}[/red]")
        raise typer.Exit(2) from exc
    if as_ is Resolution.RETRY:
        from opledger.tasks.app import reconcile

        reconcile.delay(op_id)  # the sweeper would also find it due
        console.print(f"[green]retry authorized by {operator}[/green]; key {after.idempotency_key}")
    else:
        console.print(f"[green]{op_id} is now {after.status.value}[/green]")


@contract_app.command("check")
def contract_check(
    action: Annotated[str, typer.Argument(help="An action the configured adapters serve.")],
    admin_url: Annotated[
        str | None,
        typer.Option(help="The sandbox's base URL, to inject a failure and a restart too."),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--i-accept-real-requests-to-a-remote-provider",
            help="Run against an endpoint that is neither loopback nor the adapter's declared "
            "test URL: every probe is a real request that changes things there.",
        ),
    ] = False,
    concurrency_delay: Annotated[
        float,
        typer.Option(help="With --admin-url: seconds each request executes, so two overlap."),
    ] = 0.5,
) -> None:
    """Send probe requests to the provider behind ACTION and print, fact by fact, where its
    declared contract and the provider disagree. Exits 1 on any disagreement."""
    from opledger.adapters.check import UnsafeTarget, check_contract, probe_for

    registry = load_registry(get_settings())
    try:
        adapter = registry.adapter_for(action)
        probe = probe_for(adapter)
        if probe is None:
            console.print(f"[red]the adapter serving {action} offers no contract_probe[/red]")
            raise typer.Exit(2)
        findings = check_contract(
            adapter,
            probe,
            admin_url=admin_url,
            allow_remote=allow_remote,
            concurrency_delay_s=concurrency_delay if admin_url else 0.0,
        )
    except (UnsafeTarget, LedgerError) as exc:
        console.print(f"[red]refused: {exc}[/red]")
        raise typer.Exit(2) from exc
    finally:
        registry.close()
    table = Table(title=f"contract {adapter.contract.provider} for {action}")
    for column in ("fact", "declared", "observed", "verdict"):
        table.add_column(column)
    colour = {"agrees": "green", "disagrees": "red", "not observed": "yellow"}
    for f in findings:
        table.add_row(f.fact, f.declared, f.observed, f"[{colour[f.verdict]}]{f.verdict}[/]")
    console.print(table)
    wrong = [f.fact for f in findings if f.verdict == "disagrees"]
    if wrong:
        console.print(f"[red]the contract disagrees with the provider on: {', '.join(wrong)}[/red]")
        raise typer.Exit(1)
    console.print("[green]no disagreement observed[/green]")


@app.command()
def sandbox(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port for the CRM and email APIs (0: any).")] = 0,
    smtp_port: Annotated[int, typer.Option(help="SMTP port (0: any).")] = 0,
) -> None:
    """Run the sandbox CRM, email API and SMTP server until interrupted."""
    try:
        from opledger.dev.sandbox.__main__ import serve
    except ImportError as exc:  # a production install: the servers are an extra
        console.print(
            f"the sandbox needs the sandbox extra ({exc.name} is missing): "
            "pip install 'opledger[sandbox]'",
            style="red",
            markup=False,
        )
        raise typer.Exit(2) from exc

    serve(host, port, smtp_port)


@app.command()
def worker(
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Processes (default: one per core).")
    ] = None,
    queues: Annotated[
        str, typer.Option(help="Queues to consume.")
    ] = "dispatch,reconcile,maintenance,notifications",
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="Worker node name (-n).")] = None,
) -> None:
    """Run a Celery worker for opledger's tasks (scale by running more of them)."""
    ensure_services()
    from opledger.tasks.app import app as celery_app

    argv = ["worker", "-Q", queues, "--loglevel", loglevel, "-E"]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if hostname:
        argv += ["-n", hostname]
    celery_app.worker_main(argv)


@app.command()
def beat(
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    schedule: Annotated[str, typer.Option(help="Where beat keeps its schedule state.")] = "",
) -> None:
    """Run the beat scheduler (sweep, relay, purge). Refuses to start if one already runs."""
    ensure_services()
    from opledger.cli.beatlock import BeatLock, BeatLockTaken
    from opledger.tasks.app import app as celery_app

    try:
        lock = BeatLock(database_url())
    except BeatLockTaken as exc:
        console.print(f"[red]{exc}; exactly one may run[/red]")
        raise typer.Exit(1) from exc
    path = schedule or str((devstack.STATE_DIR / "celerybeat-schedule").resolve())
    devstack.STATE_DIR.mkdir(parents=True, exist_ok=True)
    try:
        celery_app.start(["beat", "--loglevel", loglevel, "--schedule", path])
    finally:
        lock.release()


@app.command()
def flower(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 5555,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run Flower against opledger's workers, behind basic auth from the settings: every
    page, the API, /metrics and /healthcheck alike."""
    ensure_services()
    from opledger.cli.flower_auth import require_auth_everywhere
    from opledger.tasks.app import app as celery_app

    settings = get_settings()
    if not settings.flower_password:
        console.print("[red]set OPLEDGER_FLOWER_PASSWORD: Flower never runs without auth[/red]")
        raise typer.Exit(2)
    try:
        require_auth_everywhere()
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    celery_app.start(
        [
            "flower",
            f"--port={port}",
            f"--address={address}",
            f"--basic-auth={settings.flower_user}:{settings.flower_password}",
        ]
    )


@app.command()
def chaos(
    ops: Annotated[int, typer.Option(help="Operations to drive through the workers.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the breakage schedule.")] = 1,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    fault_rate: Annotated[
        float, typer.Option(help="Share of operations with a provider fault.")
    ] = 0.25,
    kill_every: Annotated[float, typer.Option(help="Mean seconds between worker kills.")] = 2.0,
    redis_restarts: Annotated[int, typer.Option(help="Redis restarts (queued messages lost).")] = 1,
    restart_postgres: Annotated[
        bool, typer.Option("--restart-postgres", help="Also restart Postgres (embedded server).")
    ] = False,
    chaos_seconds: Annotated[float, typer.Option(help="How long things keep breaking.")] = 20.0,
    settle_timeout: Annotated[
        float, typer.Option(help="Then how long it may take to settle.")
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Drive operations through real workers while killing them, injecting provider faults
    and restarting Redis (and Postgres); then audit duplicates, races, stuck and lost."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opledger.dev.chaos.run import ChaosConfig, run_chaos
    from opledger.dev.chaos.stack import Interrupted, stop_on_signals

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
    )
    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]chaos[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as bar:
        task = bar.add_task("settled", total=ops, note="")

        def progress(done: int, total: int, counters: dict[str, int]) -> None:
            note = (
                f"kills {counters['kills']} · redis {counters['redis']} · pg {counters['postgres']}"
            )
            bar.update(task, completed=done, total=total, note=note)

        with stop_on_signals():
            try:
                result = run_chaos(config, progress=progress)
            except Interrupted as stop:
                err.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
                raise typer.Exit(stop.exit_code) from None
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        table = Table("measure", "value", title=f"chaos run, seed {seed}")
        for key, value in summary.items():
            if key != "problems":
                table.add_row(key, str(value))
        console.print(table)
        for problem in summary["problems"]:
            console.print(f"[red]{problem}[/red]")
    if not result.clean:
        raise typer.Exit(1)


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
    import json
    import time

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column

    from opledger.dev.chaos.stack import Interrupted, stop_on_signals
    from opledger.dev.demo import Row, planned_scenarios, run_demo

    started = time.monotonic()
    console.print(
        "[bold]opledger demo[/bold]: an agent closes case-318 in the CRM and emails the "
        "account owner — two operations — on real Postgres, Redis, Celery workers and beat, "
        "and sandbox providers. Then the workers are broken at every crash window.\n"
    )
    table = Table("scenario", "what was broken", "final status", "provider effects", "review")
    bar = Progress(
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
    task = bar.add_task("starting", total=planned_scenarios())

    def on_phase(text: str, done: int, total: int) -> None:
        bar.update(task, description=text, completed=done, total=total)
        if not console.is_terminal:  # no live bar in a log: one line per phase
            console.print(f"[dim]{time.monotonic() - started:5.1f}s {text}[/dim]")

    def on_row(row: Row) -> None:
        console.print(f"[dim]... {row.scenario}[/dim]")
        table.add_row(row.scenario, row.broken, row.outcome, row.effects, row.review)

    with stop_on_signals(), bar:
        try:
            summary = run_demo(keep=keep, on_row=on_row, on_phase=on_phase)
        except Interrupted as stop:
            bar.stop()
            console.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
            raise typer.Exit(stop.exit_code) from None
    console.print(table)
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
    if as_json:
        print(json.dumps({k: v for k, v in summary.items() if k != "urls"}))
    if style == "red":
        raise typer.Exit(1)


@app.command()
def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="A smaller run (under two minutes).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    concurrency: Annotated[
        int | None, typer.Option(help="Worker processes for both runs (default: cores).")
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
) -> None:
    """Measure the ledger beside bare Celery (throughput ratio, round trips, sweep cost),
    and a backlog behind a slow provider drained with and without relay and sweep."""
    import dataclasses
    import json

    from opledger.dev.bench import QUICK, BenchConfig, run_bench
    from opledger.dev.chaos.stack import Interrupted, stop_on_signals

    config = QUICK if quick else BenchConfig()
    changes: dict[str, object] = {
        "concurrency": concurrency,
        "tasks": tasks,
        "prepares": prepares,
        "repeats": repeats,
    }
    if sizes:
        small, large = (int(x) for x in sizes.split(","))
        changes["sizes"] = (small, large)
    config = dataclasses.replace(config, **{k: v for k, v in changes.items() if v})  # type: ignore[arg-type]
    if backlog is not None:
        config = dataclasses.replace(config, backlog=backlog)
    config = dataclasses.replace(config, backlog_only=backlog_only)
    err = Console(stderr=True)
    with stop_on_signals():
        try:
            result = run_bench(config, progress=lambda m: err.print(f"[dim]{m}[/dim]"))
        except Interrupted as stop:
            err.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
            raise typer.Exit(stop.exit_code) from None
    if as_json:
        print(json.dumps(result))
        return
    table = Table("measure", "value", "target")
    targets = {
        "backlog_ratio": ">= 0.9",
        "backlog_msgs_per_op_max": "<= 1.5",
        "backlog_wipe_settled": f"= {config.backlog}",
        "ratio": ">= 0.8",
        "round_trips_per_op": "<= 2",
        "sweep_ms_1m": f"<= 2 x sweep_ms_10k = {2 * result['sweep_ms_10k']:.1f}",
    }
    for key, value in result.items():
        if key != "sweep_plans":
            table.add_row(key, str(value), targets.get(key, ""))
    console.print(table)
    for size, plans in result.get("sweep_plans", {}).items():
        for name, plan in plans.items():
            console.print(f"[dim]{size} {name}: {plan}[/dim]")


def main() -> None:
    app()
