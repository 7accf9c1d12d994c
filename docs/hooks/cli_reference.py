"""An MkDocs hook: the `opledger` command as the click command mkdocs-click documents.

mkdocs-click imports a module and reads a click command from it; opledger's command is a
Typer app, so this hook converts it (`typer.main.get_command`) and registers the result as
the module `opledger_cli_reference` before any page is read. docs/cli.md names it.
"""

from __future__ import annotations

import sys
import types

import typer

from opledger.cli.main import app

MODULE = "opledger_cli_reference"


def on_startup(command: str, dirty: bool) -> None:
    """Register the module once, when MkDocs starts (build or serve)."""
    reference = types.ModuleType(MODULE, "The `opledger` command, as a click command.")
    reference.command = typer.main.get_command(app)  # type: ignore[attr-defined]
    sys.modules[MODULE] = reference
