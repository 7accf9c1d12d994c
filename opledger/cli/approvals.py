"""`opledger approvals`: the acts a person approves before anything is sent."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.text import Text

from opledger.ledger import Approval, ids
from opledger.ledger.sensitive import scrub_text

from .app import JsonOption, OperatorOption, app, console, emit_json, open_ledger
from .ops import redaction
from .render import _when, records_table

approvals_app = typer.Typer(
    help="Approvals: acts their action's policy asks a person about before they are sent."
)
app.add_typer(approvals_app, name="approvals")

STATUSES = ("pending", "approved", "denied", "expired", "all")
DigestOption = Annotated[
    str,
    typer.Option(help="The payload digest `opledger approvals show` printed: what you saw."),
]


def _approvers(a: Approval) -> str:
    given = ", ".join(a.approved_by) or "none yet"
    return f"{len(a.approved_by)} of {a.approvers_required} ({given})"


@approvals_app.command("list")
def approvals_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's.")] = None,
    status: Annotated[
        str, typer.Option(help="pending (default), approved, denied, expired or all.")
    ] = "pending",
    limit: Annotated[int, typer.Option(help="At most this many, oldest first.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """Approval requests, oldest first: by default those still waiting for a person."""
    if status not in STATUSES:
        raise typer.BadParameter(f"--status is one of {', '.join(STATUSES)}")
    with open_ledger() as ledger:
        rows = ledger.approvals(
            tenant=tenant, status=None if status == "all" else status, limit=limit
        )
    if as_json:
        emit_json([r.model_dump(mode="json") for r in rows])
        return
    console.print(
        records_table(
            ("op", "tenant", "action", "target", "status", "approvals", "requested", "expires"),
            [
                (
                    r.op_id,
                    r.tenant,
                    r.action,
                    r.target,
                    r.status,
                    _approvers(r),
                    _when(r.requested_at),
                    _when(r.expires_at),
                )
                for r in rows
            ],
            title=f"{status} approvals" + (f" of {tenant}" if tenant else ""),
            keys=("op",),
        )
    )


@approvals_app.command("show")
def approvals_show(op_id: str, as_json: JsonOption = False) -> None:
    """The act to approve: its action, target, grant, why the policy asks, the frozen
    payload as shown (secrets hidden) and its digest, which `approve` and `deny` take."""
    ids.check_operation_id(op_id)
    with open_ledger() as ledger:
        approval = ledger.approval(op_id)
        payload = ledger.payload(op_id)
        decisions = ledger.approval_decisions(op_id)
    shown, hidden = (
        redaction().apply(approval.action, payload) if payload is not None else (None, [])
    )
    if as_json:
        emit_json(
            approval.model_dump(mode="json")
            | {
                "operation_reason": scrub_text(approval.operation_reason or "") or None,
                "payload": shown,
                "hidden": hidden,
                "decisions": [d.model_dump(mode="json") for d in decisions],
            }
        )
        return
    console.print(
        Text(
            f"approval of {op_id}: {approval.status} ({_approvers(approval)}); the operation "
            f"is {approval.operation_status}"
        )
    )
    console.print(
        records_table(
            ("tenant", "action", "target", "grant", "asked by", "requested", "expires"),
            [
                (
                    approval.tenant,
                    approval.action,
                    approval.target,
                    approval.authorization_ref,
                    approval.asked_by or approval.requested_by,
                    _when(approval.requested_at),
                    _when(approval.expires_at),
                )
            ],
            keys=("grant",),
        )
    )
    for reason in approval.reasons:
        console.print(Text(f"asked because: {scrub_text(reason)}"))
    if payload is None:
        console.print(Text("payload: purged; only its digest is left", overflow="fold"))
    else:
        console.print("payload, frozen when asked (exactly this is sent once approved):")
        text = json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False)
        console.print(Text(text, overflow="fold"))
        if hidden:
            console.print(Text(f"hidden: {', '.join(hidden)}", overflow="fold"))
    console.print(Text(f"digest: {approval.payload_digest}", overflow="fold"))
    if decisions:
        console.print(
            records_table(
                ("at", "operator", "decision", "digest", "note"),
                [
                    (_when(d.at), d.operator, d.decision, d.payload_digest[:16], d.note)
                    for d in decisions
                ],
                title="decisions",
            )
        )
    if approval.status == "pending":
        console.print(
            Text(
                f"to approve: opledger approvals approve {op_id} --operator YOU "
                f"--digest {approval.payload_digest}",
                overflow="fold",
            )
        )


def _shown(ledger: Any, op_id: str) -> tuple[str, Any]:
    """The action of `op_id`'s approval and its payload as `show` shows it."""
    approval = ledger.approval(op_id)
    payload = ledger.payload(op_id)
    shown = redaction().apply(approval.action, payload)[0] if payload is not None else None
    return approval.action, shown


@approvals_app.command("approve")
def approvals_approve(
    op_id: str,
    operator: OperatorOption,
    digest: DigestOption,
    note: Annotated[str | None, typer.Option(help="Why: kept in the audit trail.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Approve the act you were shown (its digest): the last approval needed releases it,
    and it is sent like any other act; until then it keeps waiting."""
    ids.check_operation_id(op_id)
    with open_ledger() as ledger:
        _, shown = _shown(ledger, op_id)
        after = ledger.approve(op_id, operator=operator, digest=digest, note=note, shown=shown)
    if after.status == "approved":
        message = f"approved by {operator}: {op_id} is released and will be sent"
    else:
        message = (
            f"approved by {operator}: {op_id} waits for "
            f"{after.approvals_missing} more approval(s) by someone else"
        )
    if as_json:
        emit_json({"approval": after.model_dump(mode="json"), "message": message})
        return
    console.print(Text(message), style="green")


@approvals_app.command("deny")
def approvals_deny(
    op_id: str,
    operator: OperatorOption,
    digest: DigestOption,
    note: Annotated[str, typer.Option(help="Why: the operation's cancellation reason.")],
    as_json: JsonOption = False,
) -> None:
    """Deny the act you were shown: it is cancelled (and what runs after it), with your
    note as the reason its asker reads."""
    ids.check_operation_id(op_id)
    with open_ledger() as ledger:
        _, shown = _shown(ledger, op_id)
        after = ledger.deny(op_id, operator=operator, digest=digest, note=note, shown=shown)
    message = f"denied by {operator}: {op_id} is cancelled"
    if as_json:
        emit_json({"approval": after.model_dump(mode="json"), "message": message})
        return
    console.print(Text(message), style="green")
