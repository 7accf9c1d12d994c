"""`opledger contract check`: each adapter's declared contract against its provider."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from opledger.adapters.registry import load_registry
from opledger.cli.failures import REFUSED
from opledger.settings import get_settings

from .app import (
    app,
    console,
)
from .render import records_table

if TYPE_CHECKING:
    from opledger.adapters.check import Finding

contract_app = typer.Typer(help="Provider contracts: what each adapter declares, checked.")
app.add_typer(contract_app, name="contract")


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

    faults = None
    if admin_url:  # the sandbox's fault routes: development tooling, through its door
        from .dev import sandbox_faults

        faults = sandbox_faults(admin_url, concurrency_delay)
    registry = load_registry(get_settings())
    try:
        adapter = registry.adapter_for(action)
        probe = probe_for(adapter)
        if probe is None:
            typer.echo(
                f"opledger: refused: the adapter serving {action} offers no contract_probe",
                err=True,
            )
            raise typer.Exit(REFUSED)
        findings = check_contract(
            adapter,
            probe,
            allow_remote=allow_remote,
            faults=faults,
        )
    except UnsafeTarget as exc:
        typer.echo(f"opledger: refused: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(REFUSED) from exc
    finally:
        registry.close()
    _print_findings(findings, f"contract {adapter.contract.provider} for {action}")


#: each verdict's colour in the table
_COLOUR = {
    "agrees": "green",
    "disagrees": "red",
    "not observed": "yellow",
    "not observable": "dim",
}


def _print_findings(findings: list[Finding], title: str) -> None:
    """The table of facts, then the disagreements in red (exit 1) or a green line."""
    table = records_table(
        ("fact", "declared", "observed", "verdict"),
        [
            (f.fact, f.declared, f.observed, Text(f.verdict, style=_COLOUR[f.verdict]))
            for f in findings
        ],
        title=title,
    )
    console.print(table)
    wrong = [f.fact for f in findings if f.verdict == "disagrees"]
    if wrong:
        console.print(f"[red]the contract disagrees with the provider on: {', '.join(wrong)}[/red]")
        _print_hints(findings)
        raise typer.Exit(1)
    console.print("[green]no disagreement observed[/green]")


def _print_hints(findings: list[Finding]) -> None:
    """One line per disagreement that names its change: what over-promises first (a way
    for a duplicate through), then what is only more cautious than the provider."""
    hinted = sorted((f for f in findings if f.hint), key=lambda f: not f.over_promises)
    for f in hinted:
        line = Text("over-promises: " if f.over_promises else "cautious: ", style="bold")
        line.stylize("red" if f.over_promises else "yellow")
        line.append(f"set {f.hint}" if not f.hint.startswith("the adapter") else f"fix {f.hint}")
        console.print(line)


# -- the review console ---------------------------------------------------------------------

#: the modules of the `[console]` extra
