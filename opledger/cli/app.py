"""The `opledger` command's root: the Typer app, the consoles, the options every group
shares, and how a command finds the services it was configured with."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from opledger.adapters.registry import load_registry
from opledger.cli.failures import OpledgerGroup
from opledger.ledger import Ledger
from opledger.settings import get_settings
from opledger.settings import state_dir as settings_state_dir

from . import devmode

app = typer.Typer(
    cls=OpledgerGroup,
    help="opledger: external side effects that happen once, or say they may not have.",
    epilog="Exit codes: 0 done, 1 a check found a problem, 2 usage, 3 refused (nothing "
    "changed), 4 operational (database, broker or settings).",
    pretty_exceptions_show_locals=False,
)

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def missing_extra(what: str, extra: str, module: str | None) -> typer.Exit:
    """Say in one line on stderr that `what` needs the `extra` extra (`module` is missing)
    and how to install it; the exit (4, operational) to raise."""
    err_console.print(
        f"{what} needs the {extra} extra ({module} is missing): pip install 'opledger[{extra}]'",
        style="red",
        markup=False,
    )
    return typer.Exit(4)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"opledger {package_version('opledger')}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="OPLEDGER_DEBUG",
            help="On a failure, print the traceback instead of one line (same exit code).",
        ),
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """The options every command shares (`--debug` is read by `OpledgerGroup`)."""


def database_url() -> str:
    """The configured ledger database. Only in development mode (OPLEDGER_DEV=1) does
    "unset" mean the local Postgres, or an embedded one devstack starts; otherwise it is
    `NotConfigured`, naming the variable."""
    settings = get_settings()
    if settings.database_url:
        return settings.database_url
    if settings.dev:
        return devmode.ledger_database_url()
    return settings.require_database_url()


def ensure_services() -> None:
    """Before starting Celery processes: make the database and broker URLs explicit, so
    every child process and the Celery config see the same ones. In development mode an
    embedded Postgres or Redis is started when nothing is configured or answering; in
    production a missing URL is `NotConfigured`."""
    os.environ["OPLEDGER_DATABASE_URL"] = database_url()
    settings = get_settings()
    if not settings.broker_url:
        if not settings.dev:
            settings.require_broker_url()
        os.environ["OPLEDGER_BROKER_URL"] = devmode.redis_url()
    get_settings.cache_clear()


def preflight(command: str, *, broker: bool = True, declare: bool = False) -> None:
    """Make the services explicit (`ensure_services`) and run the startup checks before a
    long-running process says ready: a failure is one line on stderr and exit code 4; a
    likely typo in a variable name is a warning."""
    from opledger.settings import NotConfigured

    from .checks import failures, run_checks

    try:
        ensure_services()
    except NotConfigured as exc:
        err_console.print(f"opledger {command}: {exc}", style="red", markup=False)
        raise typer.Exit(4) from None

    checks = run_checks(broker=broker, declare=declare, beat=False)
    for check in checks:
        if check.warning:
            err_console.print(
                f"opledger {command}: warning: {check.name}: {check.detail}", markup=False
            )
    failed = failures(checks)
    if failed:
        first = failed[0]
        err_console.print(
            f"opledger {command}: {first.name}: {first.detail}", style="red", markup=False
        )
        raise typer.Exit(4)


@contextmanager
def open_ledger(pool_size: int = 1) -> Iterator[Ledger]:
    """The ledger, wired to the configured adapters (for their contracts); its connections
    are closed on exit."""
    settings = get_settings()
    registry = load_registry(settings)  # a bad OPLEDGER_ADAPTERS: one line (AdaptersInvalid)
    ledger = Ledger.from_url(
        database_url(),
        actions=registry,
        pool_size=pool_size,
        **settings.ledger_options(),
    )
    try:
        yield ledger
    finally:
        ledger.engine.dispose()


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document on stdout instead (the records as the Python API "
        "returns them).",
    ),
]


def emit_json(document: Any) -> None:
    """The one JSON document a `--json` command prints: nothing else goes to stdout."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


TenantOption = Annotated[str, typer.Option(help="The tenant you act for (required).")]
OperatorOption = Annotated[str, typer.Option(help="Your name, for the audit trail.")]


ByOption = Annotated[str, typer.Option("--by", help="Your name, for the audit trail.")]


def state_dir() -> Path:
    """Where local state goes (beat's schedule; in development, the embedded services):
    `OPLEDGER_STATE_DIR`, else `.opledger` in the working directory."""
    return settings_state_dir()
