"""`opledger switches`: the ledger's epochs (each failover or restore it noticed), the
providers' answers it kept for claims it no longer knew, the replication it runs on, and
an operator's word that ends a switch's suspicion window."""

from __future__ import annotations

import logging
from datetime import UTC
from typing import Annotated

import typer
from rich.text import Text

from opledger.ledger import LedgerEpoch

from .app import JsonOption, app, console, emit_json, open_ledger
from .provenance import cancel_actor
from .render import _when, records_table

log = logging.getLogger(__name__)

switches_app = typer.Typer(
    help="The ledger's switches (failovers, restores), orphan receipts and replication.",
    invoke_without_command=True,
)
app.add_typer(switches_app, name="switches")


def _suspect(epoch: LedgerEpoch) -> str:
    if not epoch.is_switch or epoch.suspect_until is None:
        return "-"
    ended = f", ended by {epoch.ended_by}" if epoch.ended_by else ""
    return f"until {_when(epoch.suspect_until.astimezone(UTC))}{ended}"


@switches_app.callback()
def switches(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, help="How many epochs, newest first.")] = 20,
    as_json: JsonOption = False,
) -> None:
    """The ledger's epochs, newest first: the database it was migrated on, then every switch
    a process noticed (another timeline: a promotion; a step back: a restore), with what
    it quarantined and until when new asks are not sent blind."""
    if ctx.invoked_subcommand is not None:
        return
    with open_ledger() as ledger:
        epochs = ledger.epochs(limit=limit)
        replication = ledger.replication()
    if as_json:
        emit_json(
            {
                "epochs": [e.model_dump(mode="json") for e in epochs],
                "replication": replication.model_dump(mode="json")
                | {"kind": replication.kind, "summary": replication.summary()},
            }
        )
        return
    console.print(
        records_table(
            ("epoch", "since", "kind", "timeline", "reason", "quarantined", "not sent blind"),
            [
                (
                    e.epoch,
                    _when(e.began_at.astimezone(UTC)),
                    e.kind,
                    e.timeline if e.timeline is not None else "?",
                    e.reason,
                    e.quarantined,
                    _suspect(e),
                )
                for e in epochs
            ],
            keys=("epoch",),
        )
    )
    console.print(Text(f"replication: {replication.summary()}"))


@switches_app.command("orphans")
def orphans(
    unmatched: Annotated[
        bool, typer.Option("--unmatched", help="Only those not tied to an operation yet.")
    ] = False,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's.")] = None,
    limit: Annotated[int, typer.Option(min=1)] = 50,
    as_json: JsonOption = False,
) -> None:
    """Providers' answers to claims the ledger had no record of (orphan receipts), newest
    first: what each said, for which operation and intent, and the operation it became
    evidence of. A forgotten one (its claim was taken back by a switch) is tied to its
    operation once the operation is known or its act is asked again; one the ledger never
    issued is kept for a person only."""
    with open_ledger() as ledger:
        found = ledger.orphan_receipts(unmatched=unmatched, tenant=tenant, limit=limit)
    if as_json:
        emit_json([o.model_dump(mode="json") for o in found])
        return
    if not found:
        console.print(Text("no orphan receipts"))
        return
    console.print(
        records_table(
            ("id", "received", "operation", "intent", "said", "claim", "why", "evidence of"),
            [
                (
                    o.id,
                    _when(o.received_at.astimezone(UTC)),
                    o.op_id,
                    f"{o.tenant} / {o.workflow_id} / {o.intent_key}",
                    o.verdict,
                    f"fence {o.fence}, epoch {o.claim_epoch if o.claim_epoch is not None else '?'}"
                    + ("" if o.forgotten else " (never issued)"),
                    o.why,
                    o.matched_op_id or "-",
                )
                for o in found
            ],
            keys=("id",),
        )
    )


@switches_app.command("end")
def end(
    epoch: Annotated[int, typer.Argument(help="The switch, as `opledger switches` numbers it.")],
    operator: Annotated[str | None, typer.Option(help="Your name, for the record.")] = None,
) -> None:
    """End a switch's suspicion window now: operations prepared from now on are sent as
    usual. Say it once agents have asked again for what they had asked before the switch;
    operations prepared before now stay suspect (looked up or held for a person)."""
    with open_ledger() as ledger:
        actor = cancel_actor(ledger, operator)
        ended = ledger.end_suspicion(epoch, by=actor)
    console.print(Text(f"switch #{ended.epoch}: suspicion window ended by {actor}"))
