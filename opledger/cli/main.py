"""The `opledger` command: the composition root that wires the ledger, adapters and tasks.

One module per command group (as Celery's own `bin/` does); importing each registers its
commands on the root app (`opledger.cli.app`).
"""

from __future__ import annotations

from . import (  # noqa: F401
    adapters,
    approvals,
    contracts,
    dev,
    examples,
    grants,
    mcp,
    operators,
    ops,
    payloads,
    processes,
    providers,
    review,
    switches,
)
from .app import app

# `main` is the console script (pyproject.toml `[project.scripts]`); `app` is the root Typer
# app with every command group registered, for callers that invoke it (typer's CliRunner).
__all__ = ["app", "main"]


def main() -> None:
    app()
