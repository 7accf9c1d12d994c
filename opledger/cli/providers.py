"""`opledger providers`: each provider's pressure as the ledger holds it for the whole
fleet: paused (a "not now", an open breaker) and why, refused connections in a row, calls
in flight and operations waiting for its room."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from opledger.ledger.providers import ProviderState
from opledger.ledger.sensitive import scrub_text

from .app import JsonOption, app, console, emit_json, open_ledger
from .provenance import cancel_actor
from .render import _when, records_table

log = logging.getLogger(__name__)

#: what `opledger providers` says when no provider is under any pressure
NONE_UNDER_PRESSURE = "no provider has pushed back, holds a slot or has operations waiting"


def clock(value: datetime) -> str:
    """An instant as HH:MM:SS in UTC (a pause lasts minutes at most)."""
    return value.astimezone(UTC).strftime("%H:%M:%S")


def provider_state(p: ProviderState) -> str:
    """ "ok", "paused until HH:MM:SS: why" or "breaker open since ...: why" (the reason may
    quote a provider's error: what looks like a secret in it is hidden)."""
    reason = scrub_text(p.pause_reason or "")
    if p.breaker == "open":
        since = _when(p.paused_since.astimezone(UTC)) if p.paused_since else "?"
        return f"breaker open since {since}: {reason}"
    if p.paused and p.paused_until is not None:
        return f"paused until {clock(p.paused_until)}: {reason}"
    return "ok"


def providers_table(states: list[ProviderState]) -> Table:
    return records_table(
        ("provider", "state", "refusals", "in flight", "waiting"),
        [(p.provider, provider_state(p), p.failures, p.in_flight, p.waiting) for p in states],
        keys=("provider",),
    )


def provider_record(p: ProviderState) -> dict[str, Any]:
    """`p` as the --json document lists it: the record, whether it is paused now, and its
    reason with what looks like a secret hidden."""
    record = p.model_dump(mode="json") | {"paused": p.paused}
    if p.pause_reason is not None:
        record["pause_reason"] = scrub_text(p.pause_reason)
    return record


providers_app = typer.Typer(
    help="Each provider's pressure: paused or not and why, refusals, in flight, waiting.",
    invoke_without_command=True,
)
app.add_typer(providers_app, name="providers")


@providers_app.callback()
def providers(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Each provider's pressure: paused or not and why, refusals, in flight, waiting."""
    if ctx.invoked_subcommand is not None:
        return
    with open_ledger() as ledger:
        states = ledger.providers()
    if as_json:
        emit_json([provider_record(p) for p in states])
        return
    if not states:
        console.print(Text(NONE_UNDER_PRESSURE))
        return
    console.print(providers_table(states))


@providers_app.command("reset")
def providers_reset(
    provider: Annotated[
        str, typer.Argument(help="The provider, as `opledger providers` names it.")
    ],
    operator: Annotated[str | None, typer.Option(help="Your name, for the log.")] = None,
) -> None:
    """Forget a provider's pressure: its pause, open breaker, refusals and rate bucket.

    For a provider that is back before its next probe, was renamed, or whose waiting
    operations were all cancelled while its breaker was open (nothing else closes a breaker
    no call reaches). Calls in flight keep their slots; the next refusals open the breaker
    again."""
    with open_ledger() as ledger:
        actor = cancel_actor(ledger, operator)
        forgotten = ledger.forget_provider(provider)
    if not forgotten:
        console.print(Text(f"{provider}: nothing to forget"))
        return
    log.warning("provider %s: pressure forgotten by %s", provider, actor)
    console.print(Text(f"reset: {provider}'s pause, breaker and refusals forgotten, by {actor}"))
