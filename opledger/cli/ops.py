"""`opledger ops`: operations, their history and who asked for them."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from opledger.ledger import History, Operation, Status

from .app import (
    JsonOption,
    app,
    console,
    emit_json,
    open_ledger,
)
from .render import _cell, _when, new_table, records_table

ops_app = typer.Typer(help="Inspect operations.")
app.add_typer(ops_app, name="ops")


def operations_table(operations: tuple[Operation, ...]) -> Table:
    return records_table(
        ("id", "tenant", "action", "target", "status", "fence", "updated"),
        [
            (
                op.id,
                op.tenant,
                op.action,
                op.target,
                op.status.value,
                op.fence,
                _when(op.updated_at),
            )
            for op in operations
        ],
        keys=("id", "status"),
    )


#: the operation's fields `ops show` lists, in this order
SUMMARY_FIELDS = (
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
)


def history_tables(history: History) -> list[Table]:
    """The operation, its attempts, its evidence and its transitions, one table each."""
    op = history.operation
    summary = new_table("field", "value", title=f"operation {op.id}")
    for name in SUMMARY_FIELDS:
        summary.add_row(_cell(name), _cell(getattr(op, name)))
    return [
        summary,
        _attempts_table(history),
        _evidence_table(history),
        _transitions_table(history),
    ]


def _attempts_table(history: History) -> Table:
    header = (
        "n",
        "fence",
        "owner",
        "key",
        "started",
        "send by",
        "deadline",
        "finished",
        "outcome",
        "authorized by",
    )
    rows = [
        (
            a.n,
            a.fence,
            a.owner,
            a.idempotency_key,
            _when(a.started_at),
            _when(a.send_by),
            _when(a.deadline_at),
            _when(a.finished_at),
            a.outcome,
            a.authorized_by,
        )
        for a in history.attempts
    ]
    return records_table(header, rows, title="attempts", keys=("key",))


def _evidence_table(history: History) -> Table:
    rows = [
        (
            _when(e.recorded_at),
            e.source,
            e.verdict,
            "yes" if e.applied else "no (kept)",
            e.binding.model_dump_json(exclude_none=True),
            json.dumps(e.detail, ensure_ascii=False, default=str)[:300],
        )
        for e in history.evidence
    ]
    header = ("at", "source", "verdict", "applied", "binding", "detail")
    return records_table(header, rows, title="evidence")


def _transitions_table(history: History) -> Table:
    rows = [
        (
            _when(t.at),
            t.from_status.value if t.from_status else "",
            t.to_status.value,
            t.fence,
            t.actor,
            t.reason,
        )
        for t in history.transitions
    ]
    header = ("at", "from", "to", "fence", "by", "reason")
    return records_table(header, rows, title="transitions")


@ops_app.command("show")
def ops_show(op_id: str, as_json: JsonOption = False) -> None:
    """Status, attempts, evidence, transitions and asks of one operation."""
    with open_ledger() as ledger:
        history = ledger.history(op_id)
        asks = ledger.asks(op_id)
    if as_json:
        emit_json(
            {**history.model_dump(mode="json"), "asks": [a.model_dump(mode="json") for a in asks]}
        )
        return
    for table in history_tables(history):
        console.print(table)
    if asks:
        console.print(
            records_table(
                ("at", "asked by", "actor", "authorization", "differs"),
                [
                    (
                        _when(a.asked_at),
                        a.asked_by or "",
                        a.actor,
                        a.authorization_ref,
                        ", ".join(a.differs) or "nothing",
                    )
                    for a in asks
                ],
                title="asks (who asked for this intent; what differed was not sent)",
                keys=("asked by",),
            )
        )


@ops_app.command("list")
def ops_list(
    status: Annotated[list[Status] | None, typer.Option(help="Only these statuses.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """Operations, newest first."""
    with open_ledger() as ledger:
        operations = ledger.list(status=status, tenant=tenant, limit=limit)
    if as_json:
        emit_json([op.model_dump(mode="json") for op in operations])
        return
    console.print(operations_table(operations))
