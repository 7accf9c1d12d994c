"""The long-running processes and setup commands: migrate, check, worker, beat, flower, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opledger.ledger.migrate import move_schema, upgrade
from opledger.settings import get_settings

from . import devmode
from .app import (
    app,
    console,
    database_url,
    ensure_services,
    err_console,
    missing_extra,
    preflight,
)

if TYPE_CHECKING:
    from opledger.tasks.hooks import Hooks


@app.command()
def migrate(
    from_schema: Annotated[
        str | None,
        typer.Option(
            "--from-schema",
            help="Move a ledger that lives in this schema (a deployment from before the "
            "ledger had a schema of its own: public) into OPLEDGER_DATABASE_SCHEMA, with its "
            "history, in one transaction; then migrate it. Stop every worker, beat and "
            "console first.",
        ),
    ] = None,
) -> None:
    """Apply the ledger's migrations to the configured database, in its schema
    (OPLEDGER_DATABASE_SCHEMA, default opledger), creating the schema when it is missing."""
    schema = get_settings().database_schema
    if from_schema is not None:
        revision = move_schema(database_url(), source=from_schema, schema=schema)
        console.print(
            f'moved the ledger from schema "{from_schema}" (at {revision}) to "{schema}"',
            markup=False,
        )
        console.print(f'ledger schema "{schema}" is at head', style="green", markup=False)
    else:
        migrated = upgrade(database_url(), schema=schema)
        console.print(migrated.summary(), style="green", markup=False)


@app.command()
def check(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    broker: Annotated[bool, typer.Option(help="Check the broker too.")] = True,
) -> None:
    """Check the setup, one line each: settings, adapters, Postgres, schema, open
    operations' adapters, beat lock, broker. Exit 0 when all pass, 4 when one fails.
    Nothing is created or changed."""
    from .checks import failures, run_checks

    checks = run_checks(broker=broker)
    if json_output:
        import json

        typer.echo(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for item in checks:
            typer.echo(item.line())
    if failures(checks):
        raise typer.Exit(4)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Processes (default: one per core).")
    ] = None,
    queues: Annotated[
        str, typer.Option(help="Queues to consume.")
    ] = "dispatch,reconcile,maintenance,notifications",
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="Worker node name (-n).")] = None,
) -> None:
    """Run a Celery worker for opledger's tasks (scale by running more of them).

    The startup checks run first (`opledger check`); options after `--` go to Celery's own
    worker unchanged, e.g. `opledger worker -- --max-tasks-per-child 100`."""
    hooks = _crash_hooks()
    preflight("worker", declare=True)
    from opledger.tasks.app import app as celery_app
    from opledger.tasks.app import use_hooks

    if hooks is not None:
        use_hooks(hooks)  # in this process and the pool processes it forks
    argv = ["worker", "-Q", queues, "--loglevel", loglevel, "-E"]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if hostname:
        argv += ["-n", hostname]
    celery_app.worker_main(argv + list(ctx.args))


def _crash_hooks() -> Hooks | None:
    """The development harness's crash points, when `OPLEDGER_CRASHPOINT` names some:
    only in development mode (`cli.devmode`); otherwise one line and exit 4."""
    try:
        return devmode.crash_hooks(dev=get_settings().dev)
    except (devmode.CrashPointsOutsideDev, ValueError) as exc:
        err_console.print(f"opledger worker: {exc}", style="red", markup=False)
        raise typer.Exit(4) from None


@app.command()
def beat(
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    schedule: Annotated[str, typer.Option(help="Where beat keeps its schedule state.")] = "",
) -> None:
    """Run the beat scheduler (sweep, relay, purge). Refuses to start if one already runs."""
    preflight("beat", declare=True)
    from opledger.tasks.app import app as celery_app
    from opledger.tasks.beat import BeatLock, BeatLockTaken, schedule_file

    path = Path(schedule) if schedule else schedule_file()
    try:  # beat keeps its schedule there: find out now, not after it said ready
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        err_console.print(
            f"opledger beat: cannot write the beat schedule in {path.parent}: "
            f"{exc.strerror or exc} (pass --schedule PATH, or set OPLEDGER_STATE_DIR)",
            style="red",
            markup=False,
        )
        raise typer.Exit(4) from None
    try:
        lock = BeatLock(database_url(), schema=get_settings().database_schema)
    except BeatLockTaken as exc:
        err_console.print(f"opledger beat: {exc}; exactly one may run", style="red")
        raise typer.Exit(4) from exc
    try:
        celery_app.start(["beat", "--loglevel", loglevel, "--schedule", str(path.resolve())])
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
def metrics(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 9464,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics on /metrics: the ledger's gauges (read on each scrape) and
    the workers' counters (from PROMETHEUS_MULTIPROC_DIR), behind Flower's basic auth."""
    try:
        from opledger.observability.server import make_server
    except ImportError as exc:  # a production install without the extra
        raise missing_extra("opledger metrics:", "metrics", exc.name) from None
    settings = get_settings()
    if not settings.flower_password:
        err_console.print(
            "opledger metrics: set OPLEDGER_FLOWER_PASSWORD: the metrics never run without "
            "auth (the same credentials as Flower)",
            style="red",
            markup=False,
        )
        raise typer.Exit(4)  # a missing setting: operational, as docs/cli.md's exit codes say
    from opledger.ledger.connector import ledger_engine

    engine = ledger_engine(
        database_url(), schema=settings.database_schema, pool_size=1, pool_pre_ping=True
    )
    server = make_server(
        engine,
        user=settings.flower_user,
        password=settings.flower_password,
        address=address,
        port=port,
    )
    typer.echo(f"opledger metrics on http://{address}:{server.server_port}/metrics", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.dispose()
