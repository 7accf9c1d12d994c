"""The `opledger` command: the composition root that wires the ledger, adapters and tasks."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from opledger import devstack
from opledger.ledger import History, Ledger, LedgerError, Operation, Status
from opledger.ledger.migrate import upgrade
from opledger.settings import get_settings

app = typer.Typer(
    help="opledger: external side effects that happen once, or say they may not have."
)
ops_app = typer.Typer(help="Inspect operations.")
app.add_typer(ops_app, name="ops")
console = Console()


def database_url() -> str:
    """The configured ledger database, or the development one devstack finds or starts."""
    return get_settings().database_url or devstack.ledger_database_url()


def open_ledger() -> Ledger:
    settings = get_settings()
    return Ledger.from_url(database_url(), max_payload_bytes=settings.max_payload_bytes)


@app.command()
def migrate() -> None:
    """Apply the ledger's migrations to the configured database."""
    upgrade(database_url())
    console.print("[green]ledger schema is at head[/green]")


def _when(value: object) -> str:
    return "" if value is None else str(value)[:23]


def operations_table(operations: tuple[Operation, ...]) -> Table:
    table = Table("id", "tenant", "action", "target", "status", "fence", "updated")
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
        "provider_request_id",
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
            a.key,
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
        history = open_ledger().history(op_id)
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
        operations = open_ledger().list(status=status, tenant=tenant, limit=limit)
    except LedgerError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    console.print(operations_table(operations))


@app.command()
def sandbox(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port for the CRM and email APIs (0: any).")] = 0,
    smtp_port: Annotated[int, typer.Option(help="SMTP port (0: any).")] = 0,
) -> None:
    """Run the sandbox CRM, email API and SMTP server until interrupted."""
    from opledger.sandbox.__main__ import serve

    serve(host, port, smtp_port)


def main() -> None:
    app()
