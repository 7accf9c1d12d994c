"""`opledger grant`: authorizations."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from opledger.ledger import Authorization

from .app import (
    ByOption,
    JsonOption,
    app,
    console,
    emit_json,
    open_ledger,
)
from .render import _when, records_table

grant_app = typer.Typer(help="Authorizations: which actions a tenant's operations may write.")
app.add_typer(grant_app, name="grant")


def _grant_record(grant: Authorization, now: datetime) -> dict[str, Any]:
    return grant.model_dump(mode="json") | {"active": grant.active_at(now)}


def _grant_state(grant: Authorization, now: datetime) -> str:
    if grant.revoked_at is not None:
        return f"revoked {_when(grant.revoked_at)} by {grant.revoked_by}: {grant.revoke_reason}"
    if grant.expires_at is not None and grant.expires_at <= now:
        return f"expired {_when(grant.expires_at)}"
    return "active"


def grants_table(grants: tuple[Authorization, ...], now: datetime) -> Table:
    return records_table(
        ("ref", "tenant", "scope", "granted", "by", "expires", "state"),
        [
            (
                g.ref,
                g.tenant,
                " ".join(g.scope),
                _when(g.granted_at),
                g.granted_by,
                _when(g.expires_at) or "never",
                _grant_state(g, now),
            )
            for g in grants
        ],
        keys=("ref",),
    )


def _show_grants(grants: tuple[Authorization, ...], *, as_json: bool, one: bool) -> None:
    now = datetime.now(UTC)
    if as_json:
        records = [_grant_record(g, now) for g in grants]
        emit_json(records[0] if one else records)
    else:
        console.print(grants_table(grants, now))


def parse_instant(text: str | None) -> datetime | None:
    """An ISO 8601 instant with its timezone, e.g. 2030-01-31T18:00:00Z."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: use ISO 8601, e.g. 2030-01-31T18:00:00Z") from None
    if value.tzinfo is None:
        raise typer.BadParameter(f"{text!r} has no timezone: add one, e.g. Z or +02:00")
    return value


@grant_app.command("create")
def grant_create(
    tenant: Annotated[str, typer.Option(help="The tenant whose operations it allows.")],
    scope: Annotated[
        list[str],
        typer.Option(help="An action, or a pattern such as 'crm.*' (repeat for more)."),
    ],
    by: ByOption,
    ref: Annotated[
        str | None, typer.Option(help="The grant's reference (default: a new auth_... id).")
    ] = None,
    expires_at: Annotated[
        str | None, typer.Option(help="When it stops allowing writes (ISO 8601, with a zone).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Grant a tenant's operations the actions matching the scope. The same grant again
    (same ref, tenant and scope) is returned unchanged; another one under the ref is refused."""
    until = parse_instant(expires_at)
    with open_ledger() as ledger:
        grant = ledger.grant(tenant=tenant, scope=scope, granted_by=by, ref=ref, expires_at=until)
    _show_grants((grant,), as_json=as_json, one=True)


@grant_app.command("list")
def grant_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's grants.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """Grants, newest first, revoked and expired ones too."""
    with open_ledger() as ledger:
        grants = ledger.authorizations(tenant=tenant, limit=limit)
    _show_grants(grants, as_json=as_json, one=False)


@grant_app.command("show")
def grant_show(
    ref: Annotated[str, typer.Argument(help="The grant's reference.")],
    as_json: JsonOption = False,
) -> None:
    """One grant: its scope, who granted it, whether it is still active."""
    with open_ledger() as ledger:
        grant = ledger.authorization(ref)
    _show_grants((grant,), as_json=as_json, one=True)


@grant_app.command("revoke")
def grant_revoke(
    ref: Annotated[str, typer.Argument(help="The grant's reference.")],
    by: ByOption,
    reason: Annotated[str, typer.Option(help="Why: kept with the grant.")],
    as_json: JsonOption = False,
) -> None:
    """Revoke a grant: no new write under it; prepared operations under it are cancelled
    when a worker next tries them. Revoking twice keeps the first revocation."""
    with open_ledger() as ledger:
        grant = ledger.revoke(ref, by=by, reason=reason)
    _show_grants((grant,), as_json=as_json, one=True)
