"""`opledger ops`: operations, their history and who asked for them."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from opledger.console.redaction import Redaction
from opledger.ledger import ForbiddenTransition, History, Ledger, Operation, Status
from opledger.ledger.beats import START_BEAT, BeatSeen
from opledger.ledger.contract import Contract
from opledger.ledger.evidence import Proof, proves
from opledger.ledger.ids import check_operation_id
from opledger.ledger.sensitive import scrub_text
from opledger.settings import get_settings

from .app import (
    JsonOption,
    app,
    console,
    emit_json,
    open_ledger,
)
from .provenance import cancel_actor
from .providers import clock
from .render import _cell, _when, new_table, records_table

ops_app = typer.Typer(help="Inspect operations.")
app.add_typer(ops_app, name="ops")


def waits_until(op: Operation) -> datetime | None:
    """When a prepared operation deferred for its provider's room is sent again (its
    limits, a "not now", an open breaker); None for any other."""
    return op.next_check_at if op.status is Status.PREPARED else None


def status_cell(op: Operation) -> str:
    """The status, and for a prepared operation deferred for its provider's room, whom it
    waits for and until when ("prepared, waits for crm until 12:00:03", in UTC)."""
    until = waits_until(op)
    if until is None:
        return op.status.value
    return f"{op.status.value}, waits for {op.provider} until {clock(until)}"


def operations_table(operations: tuple[Operation, ...]) -> Table:
    return records_table(
        ("id", "tenant", "action", "target", "status", "fence", "updated"),
        [
            (
                op.id,
                op.tenant,
                op.action,
                op.target,
                status_cell(op),
                op.fence,
                _when(op.updated_at),
            )
            for op in operations
        ],
        keys=("id",),
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


def contract_of(ledger: Ledger, action: str) -> Contract | None:
    """The adapter's contract for `action`, if the configured registry declares one (what
    `proves` reads, as the retry decision does); None for an action no adapter serves."""
    contract_for = getattr(ledger.actions, "contract_for", None)
    if not callable(contract_for):
        return None
    try:
        contract = contract_for(action)
    except Exception:  # an action whose adapter is gone: judge the binding alone
        return None
    return contract if isinstance(contract, Contract) else None


def proofs(history: History, contract: Contract | None) -> list[Proof]:
    """What each piece of `history`'s evidence proves, in its order."""
    return [proves(e, history.operation, history.attempts, contract) for e in history.evidence]


def redaction() -> Redaction:
    """What the CLI hides of what it shows: secrets everywhere, and the bundled and
    `OPLEDGER_REDACT` rules per action (the console's `Redaction`)."""
    return Redaction.configured(get_settings().redact)


def history_document(
    history: History, contract: Contract | None, redaction: Redaction
) -> dict[str, Any]:
    """`history` as a --json document: the responses, details and review snapshots with
    their secrets hidden, and what each piece of evidence proves (judged on the record)."""
    action = history.operation.action
    attempts, evidence = redaction.results(action, history.attempts, history.evidence)
    reviews = tuple(
        r.model_copy(
            update={
                "snapshot": redaction.document(action, r.snapshot),
                "reason": scrub_text(r.reason),  # free text: it may quote a provider
            }
        )
        for r in history.reviews
    )
    transitions = tuple(
        t.model_copy(update={"reason": scrub_text(t.reason)}) for t in history.transitions
    )
    shown = history.model_copy(
        update={
            "attempts": tuple(attempts),
            "evidence": tuple(evidence),
            "reviews": reviews,
            "transitions": transitions,
        }
    )
    document = shown.model_dump(mode="json")
    document["evidence"] = with_proofs(document["evidence"], proofs(history, contract))
    return document


def with_proofs(evidence: list[dict[str, Any]], said: list[Proof]) -> list[dict[str, Any]]:
    """The evidence records of a --json document, each with what it proves (`proves`)."""
    return [record | {"proves": proof} for record, proof in zip(evidence, said, strict=True)]


def history_tables(
    history: History, redaction: Redaction, contract: Contract | None = None
) -> list[Table]:
    """The operation, its attempts, its evidence (details as `redaction` shows them) and its
    transitions, one table each."""
    op = history.operation
    summary = new_table("field", "value", title=f"operation {op.id}")
    for name in SUMMARY_FIELDS:
        summary.add_row(_cell(name), _cell(getattr(op, name)))
    return [
        summary,
        _attempts_table(history),
        _evidence_table(history, redaction, contract),
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


def _evidence_table(history: History, redaction: Redaction, contract: Contract | None) -> Table:
    """Each piece of evidence: what it proves about the effect ("applied", "not applied",
    "unknown"), and whether it moved the operation's status or was only kept."""
    rows = [
        (
            _when(e.recorded_at),
            e.source,
            e.verdict,
            proof,
            "yes" if e.applied else "no (kept)",
            e.binding.model_dump_json(exclude_none=True),
            json.dumps(
                redaction.document(history.operation.action, e.detail),
                ensure_ascii=False,
                default=str,
            )[:300],
        )
        for e, proof in zip(history.evidence, proofs(history, contract), strict=True)
    ]
    header = ("at", "source", "verdict", "proves", "moved status", "binding", "detail")
    return records_table(header, rows, title="evidence")


def _transitions_table(history: History) -> Table:
    rows = [
        (
            _when(t.at),
            t.from_status.value if t.from_status else "",
            t.to_status.value,
            t.fence,
            t.actor,
            scrub_text(t.reason),
        )
        for t in history.transitions
    ]
    header = ("at", "from", "to", "fence", "by", "reason")
    return records_table(header, rows, title="transitions")


def reviews_table(history: History) -> Table:
    """The operation's reviews: why each opened, and who resolved it, how and why."""
    rows = [
        (
            _when(r.opened_at),
            scrub_text(r.reason),
            r.resolution or "open",
            r.resolved_by or "",
            _when(r.resolved_at),
            r.note or "",
        )
        for r in history.reviews
    ]
    header = ("opened", "reason", "resolution", "by", "resolved", "note")
    return records_table(header, rows, title="reviews")


def waits_for_beat(op: Operation, seen: BeatSeen) -> str | None:
    """For a prepared operation no dependency holds (only beat's relay publishes it again,
    if its message was lost or it was left for later) while no beat ticked within
    `OPLEDGER_BEAT_MISSING_AFTER_SECONDS`: that it waits for beat, and since when none was
    seen. None otherwise."""
    after = get_settings().beat_missing_after_seconds
    if (
        op.status is not Status.PREPARED
        or op.waiting_on
        or not seen.missing(timedelta(seconds=after))
    ):
        return None
    return (
        f"waits for beat, {seen.since()}: beat's relay publishes a prepared operation no "
        f"worker got, and none runs; {START_BEAT}"
    )


@ops_app.command("show")
def ops_show(op_id: str, as_json: JsonOption = False) -> None:
    """Status, attempts, evidence, transitions and asks of one operation; for a prepared
    one, whether it waits for a beat that is not running."""
    with open_ledger() as ledger:
        history = ledger.history(op_id)
        asks = ledger.asks(op_id)
        contract = contract_of(ledger, history.operation.action)
        op = history.operation
        beat = waits_for_beat(op, ledger.beat_seen()) if op.status is Status.PREPARED else None
    shown = redaction()
    if as_json:
        document = history_document(history, contract, shown)
        emit_json(
            {**document, "asks": [a.model_dump(mode="json") for a in asks], "waits_for_beat": beat}
        )
        return
    for table in history_tables(history, shown, contract):
        console.print(table)
    if beat is not None:
        console.print(Text(f"{op.id} {beat}", style="yellow"))
    if history.reviews:
        console.print(reviews_table(history))
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


def operation_record(op: Operation) -> dict[str, Any]:
    """`op` as `ops list --json` lists it: the record, and `waits_until`, when a prepared
    operation deferred for its provider's room is sent again (else null)."""
    record = op.model_dump(mode="json")
    return record | {"waits_until": record["next_check_at"] if waits_until(op) else None}


#: what `ops list` says under a full page: how to get the next one
NEXT_PAGE = "more: add --before {last} for the next page"


@ops_app.command("list")
def ops_list(
    status: Annotated[list[Status] | None, typer.Option(help="Only these statuses.")] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant.")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only this workflow id.")] = None,
    action: Annotated[
        str | None, typer.Option(help="Only this action, or a prefix ending in * (crm.*).")
    ] = None,
    before: Annotated[
        str | None,
        typer.Option(
            help="The next page: only operations older than this operation id (the last "
            "one of the previous page)."
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000, help="At most this many.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """Operations, newest first, a page at a time (a full page says how to get the next)."""
    with open_ledger() as ledger:
        found = ledger.list(
            status=status,
            tenant=tenant,
            workflow_id=workflow,
            action=action,
            before=before,
            limit=limit + 1,  # one more than shown: whether there is a next page
        )
    operations, more = found[:limit], len(found) > limit
    if as_json:
        emit_json([operation_record(op) for op in operations])
        return
    console.print(operations_table(operations))
    if more:
        console.print(Text(NEXT_PAGE.format(last=operations[-1].id)))


#: what a refused cancel adds, by the status that refused it
CANCEL_HINTS: dict[str, str] = {
    Status.DISPATCHING: ": a worker holds it and may be calling the provider now",
    Status.UNKNOWN: ": an attempt may have taken effect, or a review holds it; settle it "
    "through its review (opledger review resolve {op_id} --as cancel ...)",
}


@ops_app.command("cancel")
def ops_cancel(
    op_id: Annotated[str, typer.Argument(help="The operation to cancel.")],
    reason: Annotated[str, typer.Option(help="Why: kept in the operation's transitions.")],
    operator: Annotated[str | None, typer.Option(help="Your name, for the audit trail.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Cancel an operation nothing of which reached a provider: nothing will be sent.

    A prepared operation, or an unknown one whose every attempt provably sent nothing (held
    because no worker's adapter serves its action, say) and no open review holds. One that
    may have taken effect is settled through its review (`opledger review resolve ... --as
    cancel`). The transition records you as `--operator`, with the OS user and the
    database role the command ran as."""
    check_operation_id(op_id)  # a malformed id is refused before anything is asked
    with open_ledger() as ledger:
        actor = cancel_actor(ledger, operator)
        try:
            cancelled = ledger.cancel(op_id, reason=reason, actor=actor)
        except ForbiddenTransition as exc:
            raise ForbiddenTransition(
                f"{exc}{CANCEL_HINTS.get(str(exc.fields.get('status')), '').format(op_id=op_id)}",
                **exc.fields,
            ) from exc
    if as_json:
        emit_json(cancelled.model_dump(mode="json"))
        return
    console.print(Text(f"cancelled: {cancelled.id} is now {cancelled.status.value}, by {actor}"))
