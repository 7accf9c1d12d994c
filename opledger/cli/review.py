"""`opledger review`: the operator review queue."""

from __future__ import annotations

import json
import sys
import traceback
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from opledger.cli.failures import debugging
from opledger.ledger import History, Resolution, ReviewView, ids
from opledger.ledger.consequences import contract_facts
from opledger.ledger.errors import InvalidInput
from opledger.ledger.sensitive import scrub_text

from .app import (
    JsonOption,
    OperatorOption,
    TenantOption,
    app,
    console,
    emit_json,
    open_ledger,
)
from .ops import history_tables, proofs, redaction, with_proofs
from .provenance import resolution_note
from .render import _cell, _when, new_table, records_table

if TYPE_CHECKING:
    from opledger.console.redaction import Redaction

review_app = typer.Typer(help="The operator review queue: what no evidence could decide.")
app.add_typer(review_app, name="review")


def parse_age(text: str) -> timedelta:
    """'90s', '15m', '2h', '3d' -> timedelta (`opledger.ledger.ids.parse_age`); a usage
    error (exit 2) otherwise."""
    try:
        return ids.parse_age(text)
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc)) from None


@review_app.command("list")
def review_list(
    tenant: TenantOption,
    older_than: Annotated[
        str | None, typer.Option(help="Only reviews older than, e.g. 2h.")
    ] = None,
    action: Annotated[str | None, typer.Option(help="An action, or a prefix ending in *.")] = None,
    reason: Annotated[
        str | None,
        typer.Option(help="Part of the reason, e.g. possible_duplicate (any case)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="At most this many, oldest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """Open reviews of one tenant, oldest first."""
    age = parse_age(older_than) if older_than else None
    with open_ledger() as ledger:
        rows = ledger.reviews.list(
            tenant=tenant, older_than=age, action=action, reason=reason, limit=limit
        )
    if as_json:
        emit_json([r.model_dump(mode="json") | {"reason": scrub_text(r.reason)} for r in rows])
        return
    table = records_table(
        ("op", "action", "target", "opened", "reason"),
        [(r.op_id, r.action, r.target, _when(r.opened_at), scrub_text(r.reason)) for r in rows],
        title=f"open reviews of {tenant}",
        keys=("op",),
    )
    console.print(table)


@review_app.command("show")
def review_show(
    op_id: str, tenant: TenantOption, operator: OperatorOption, as_json: JsonOption = False
) -> None:
    """What was attempted, the evidence, the frozen payload, and what each resolution could
    cause.

    Recorded as your latest view: a resolution is checked against it.
    """
    with open_ledger() as ledger:
        view = ledger.reviews.show(op_id, tenant=tenant, operator=operator)
        payload = ledger.payload(op_id)
        earlier = ledger.reviews.audit(op_id, tenant=tenant)
    history = History(
        operation=view.operation,
        attempts=view.attempts,
        evidence=view.evidence,
        transitions=(),
        reviews=(view.review,),
    )
    rules = redaction()
    action = view.operation.action
    shown_payload, hidden = rules.apply(action, payload) if payload is not None else (None, [])
    if as_json:
        document = _review_document(view, history, rules)
        emit_json(document | {"payload": shown_payload, "hidden": hidden})
        return
    console.print(f"[bold]review of {op_id}[/bold] opened {_when(view.review.opened_at)}")
    console.print(Text(f"reason: {scrub_text(view.review.reason)}"))
    for table in history_tables(history, rules, view.contract)[:3]:
        console.print(table)
    if earlier:  # an earlier review of this operation, resolved (e.g. a retry)
        console.print(
            records_table(
                ("at", "operator", "resolution", "note"),
                [(_when(a.at), a.operator, a.resolution.value, a.note) for a in earlier],
                title="earlier resolutions",
            )
        )
    _print_payload(view, shown_payload, hidden, purged=payload is None)
    if view.contract is not None:
        console.print(Text(f"provider contract: {view.contract.provider}"))
        for fact in contract_facts(view.contract):
            console.print(Text(f"  - {fact}"))
    hint = view.review.snapshot.get("search_hint")
    if hint:
        console.print(Text(f"to check by hand: {hint}"))
    console.print(_consequences_table(view))
    console.print(Text(f"shown to {operator} at version {view.operation.record_version}"))


def _review_document(view: ReviewView, history: History, rules: Redaction) -> dict[str, Any]:
    """The review as `review show --json` prints it (less the payload): secrets hidden,
    and what each piece of evidence proves."""
    action = view.operation.action
    attempts, evidence = rules.results(action, view.attempts, view.evidence)
    snapshot = rules.document(action, view.review.snapshot)
    shown = view.model_copy(
        update={
            "attempts": tuple(attempts),
            "evidence": tuple(evidence),
            "review": view.review.model_copy(
                update={"snapshot": snapshot, "reason": scrub_text(view.review.reason)}
            ),
        }
    )
    document: dict[str, Any] = shown.model_dump(mode="json")
    document["evidence"] = with_proofs(document["evidence"], proofs(history, view.contract))
    return document


def _print_payload(view: ReviewView, shown: Any, hidden: list[str], *, purged: bool) -> None:
    """The frozen payload as shown (only its digest once purged), and what was hidden."""
    digest = view.operation.payload_digest
    if purged:
        console.print(
            Text(
                "payload: purged (finished operations' frozen payloads are deleted after "
                f"OPLEDGER_PAYLOAD_RETENTION_DAYS); only its digest is left: {digest}",
                overflow="fold",
            )
        )
        return
    console.print("payload, frozen when prepared (every attempt sends exactly this):")
    text = json.dumps(shown, indent=2, sort_keys=True, ensure_ascii=False)
    console.print(Text(text, overflow="fold"))
    if hidden:
        console.print(
            Text(
                f"hidden: {', '.join(hidden)} (sha256 of the whole payload: {digest})",
                overflow="fold",
            )
        )


def _consequences_table(view: ReviewView) -> Table:
    """What each resolution could cause, from the contract's facts."""
    effects = new_table("resolution", "what it could cause", title="consequences")
    if view.operation.status.final:  # a possible duplicate: the operation stays as it is
        effects.add_row(
            "acknowledged",
            f"{view.operation.id} stays {view.operation.status.value}; your note records what "
            "you found (a second effect or none) and what you did about it",
        )
        return effects
    if view.consequences is None:
        effects.add_row("all", "no adapter contract is known for this action: judge with care")
        return effects
    e = view.consequences
    effects.add_row("confirmed", _cell(e.confirmed))
    effects.add_row("rejected", _cell(e.rejected))
    no_dedup = view.contract is not None and view.contract.idempotency.kind == "none"
    effects.add_row("retry --accept-risk" if no_dedup else "retry", _cell(e.retry))
    if not no_dedup:
        effects.add_row("retry --new-key", _cell(e.retry_new_key))
    effects.add_row("cancel", _cell(e.cancel))
    return effects


#: what `review resolve --as retry` says when the broker could not take the retry now
RETRY_DEFERRED = "resolved; the retry will be sent when the broker is back (the sweep picks it up)"


def publish_retry(op_id: str, *, debug: bool) -> str | None:
    """Hand an authorized retry to a reconcile worker now; None when published, else why
    not. Best effort: the resolution is already saved and the check due at once, so the
    sweep hands it out when the broker is back."""
    try:
        from opledger.tasks.app import publish_reconcile

        publish_reconcile(op_id)
    except Exception as exc:  # the broker is down or misconfigured: the sweep recovers it
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        lines = str(exc).strip().splitlines()
        return " ".join(lines[0].split()) if lines else type(exc).__name__
    return None


@review_app.command("resolve")
def review_resolve(
    ctx: typer.Context,
    op_id: str,
    tenant: TenantOption,
    operator: OperatorOption,
    as_: Annotated[
        Resolution,
        typer.Option(
            "--as",
            help="confirmed, rejected, retry or cancel; acknowledged for the review of a "
            "confirmed operation (a possible duplicate), which moves nothing.",
        ),
    ],
    note: Annotated[str, typer.Option(help="Why: kept in the audit trail.")],
    evidence: Annotated[str | None, typer.Option(help="What you checked, if anything.")] = None,
    new_key: Annotated[
        bool, typer.Option("--new-key", help="Retry with a new key, accepting the risk shown.")
    ] = False,
    accept_risk: Annotated[
        bool,
        typer.Option(
            "--accept-risk",
            help="Retry although the provider does not deduplicate: the effect may repeat.",
        ),
    ] = False,
    override_evidence: Annotated[
        bool,
        typer.Option(
            "--override-evidence",
            help="Resolve against evidence on record that binds this operation (audited).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Settle a review you were shown: a fenced transition plus an audit row.

    A retry is handed to a worker at once; if the broker is down, the resolution still
    stands and the sweep sends the retry when the broker is back (exit 0).

    The note records, beside your name, the OS user and the database role the command ran
    as."""
    ids.check_operation_id(op_id)  # a malformed id is refused before anything is asked
    with open_ledger() as ledger:
        after = ledger.reviews.resolve(
            op_id,
            tenant=tenant,
            operator=operator,
            resolution=as_,
            note=resolution_note(ledger, note),  # who ran it: the OS user and database role
            evidence=evidence,
            new_key=new_key,
            acknowledge_risk=accept_risk,
            override_evidence=override_evidence,
        )
    unpublished = publish_retry(op_id, debug=debugging(ctx)) if as_ is Resolution.RETRY else None
    if as_ is Resolution.ACKNOWLEDGED:
        message = f"resolved: acknowledged; {op_id} stays {after.status.value}"
    elif as_ is not Resolution.RETRY:
        message = f"resolved: {op_id} is now {after.status.value}"
    elif unpublished is None:
        message = (
            f"resolved: retry authorized by {operator} (key {after.idempotency_key}), "
            "handed to a worker"
        )
    else:
        message = RETRY_DEFERRED
        typer.echo(f"opledger: the broker could not take the retry now: {unpublished}", err=True)
    if as_json:
        emit_json(
            {
                "operation": after.model_dump(mode="json"),
                "resolution": as_.value,
                "retry_published": None if as_ is not Resolution.RETRY else unpublished is None,
                "message": message,
            }
        )
        return
    console.print(Text(message), style="green")


@review_app.command("audit")
def review_audit(op_id: str, tenant: TenantOption, as_json: JsonOption = False) -> None:
    """Every resolution of one operation's reviews, oldest first: who, when, why, and
    whether they overrode evidence or accepted a risk."""
    with open_ledger() as ledger:
        op = ledger.get(op_id)  # an unknown operation is refused, not an empty trail
        actions = ledger.reviews.audit(op_id, tenant=tenant)
    if as_json:
        rules = redaction()  # the view each resolution was made from, as `show` showed it
        emit_json(
            [
                a.model_copy(update={"shown": rules.document(op.action, a.shown)}).model_dump(
                    mode="json"
                )
                for a in actions
            ]
        )
        return
    table = records_table(
        (
            "at",
            "operator",
            "resolution",
            "note",
            "evidence",
            "new key",
            "fence",
            "overrode evidence",
            "accepted a risk",
        ),
        [
            (
                _when(a.at),
                a.operator,
                a.resolution.value,
                a.note,
                a.evidence,
                a.new_key,
                a.fence,
                "yes" if a.override_evidence else "no",
                "yes" if a.risk_acknowledged else "no",
            )
            for a in actions
        ],
        title=f"resolutions of {op_id}",
        keys=("new key",),
    )
    console.print(table)
    if not actions:
        console.print(Text(f"no resolution of {op_id} in tenant {tenant!r}"))


# -- grants ----------------------------------------------------------------------------------
