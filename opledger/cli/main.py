"""The `opledger` command: the composition root that wires the ledger, adapters and tasks."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from opledger.adapters.registry import load_registry
from opledger.cli.failures import REFUSED, OpledgerGroup, debugging
from opledger.dev import devstack
from opledger.ledger import Authorization, History, Ledger, Operation, Resolution, Status
from opledger.ledger.consequences import contract_facts
from opledger.ledger.migrate import upgrade
from opledger.settings import NotConfigured, get_settings

app = typer.Typer(
    cls=OpledgerGroup,
    help="opledger: external side effects that happen once, or say they may not have.",
    epilog="Exit codes: 0 done, 1 a check found a problem, 2 usage, 3 refused (nothing "
    "changed), 4 operational (database, broker or settings).",
    pretty_exceptions_show_locals=False,
)
ops_app = typer.Typer(help="Inspect operations.")
app.add_typer(ops_app, name="ops")
review_app = typer.Typer(help="The operator review queue: what no evidence could decide.")
app.add_typer(review_app, name="review")
grant_app = typer.Typer(help="Authorizations: which actions a tenant's operations may write.")
app.add_typer(grant_app, name="grant")
contract_app = typer.Typer(help="Provider contracts: what each adapter declares, checked.")
app.add_typer(contract_app, name="contract")
operator_app = typer.Typer(help="Operators of the review console: accounts and their tenants.")
app.add_typer(operator_app, name="operator")
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"opledger {package_version('opledger')}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            envvar="OPLEDGER_DEBUG",
            help="On a failure, print the traceback instead of one line (same exit code).",
        ),
    ] = False,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """The options every command shares (`--debug` is read by `OpledgerGroup`)."""


def database_url() -> str:
    """The configured ledger database. Only in development mode (OPLEDGER_DEV=1) does
    "unset" mean the local Postgres, or an embedded one devstack starts; otherwise it is
    `NotConfigured`, naming the variable."""
    settings = get_settings()
    if settings.database_url:
        return settings.database_url
    if settings.dev:
        return devstack.ledger_database_url()
    return settings.require_database_url()


def ensure_services() -> None:
    """Before starting Celery processes: make the database and broker URLs explicit, so
    every child process and the Celery config see the same ones. In development mode an
    embedded Postgres or Redis is started when nothing is configured or answering; in
    production a missing URL is `NotConfigured`."""
    os.environ["OPLEDGER_DATABASE_URL"] = database_url()
    settings = get_settings()
    if not settings.broker_url:
        if not settings.dev:
            settings.require_broker_url()
        os.environ["OPLEDGER_BROKER_URL"] = devstack.redis_url()
    get_settings.cache_clear()


def preflight(command: str, *, broker: bool = True, declare: bool = False) -> None:
    """Make the services explicit (`ensure_services`) and run the startup checks before a
    long-running process says ready: a failure is one line on stderr and exit code 4; a
    likely typo in a variable name is a warning."""
    from opledger.settings import NotConfigured

    from .checks import failures, run_checks

    try:
        ensure_services()
    except NotConfigured as exc:
        err_console.print(f"opledger {command}: {exc}", style="red", markup=False)
        raise typer.Exit(4) from None

    checks = run_checks(broker=broker, declare=declare)
    for check in checks:
        if check.warning:
            err_console.print(f"opledger {command}: warning: {check.name}: {check.detail}")
    failed = failures(checks)
    if failed:
        first = failed[0]
        err_console.print(
            f"opledger {command}: {first.name}: {first.detail}", style="red", markup=False
        )
        raise typer.Exit(4)


@contextmanager
def open_ledger(pool_size: int = 1) -> Iterator[Ledger]:
    """The ledger, wired to the configured adapters (for their contracts); its connections
    are closed on exit."""
    settings = get_settings()
    try:
        registry = load_registry(settings)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise NotConfigured(f"OPLEDGER_ADAPTERS={settings.adapters}: {exc}") from exc
    ledger = Ledger.from_url(
        database_url(),
        actions=registry,
        max_payload_bytes=settings.max_payload_bytes,
        pool_size=pool_size,
    )
    try:
        yield ledger
    finally:
        ledger.engine.dispose()


@app.command()
def migrate() -> None:
    """Apply the ledger's migrations to the configured database."""
    upgrade(database_url())
    console.print("[green]ledger schema is at head[/green]")


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON document on stdout instead (the records as the Python API "
        "returns them).",
    ),
]


def emit_json(document: Any) -> None:
    """The one JSON document a `--json` command prints: nothing else goes to stdout."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")


def _when(value: object) -> str:
    return "" if value is None else str(value)[:19]


def _cell(value: object) -> Text:
    """A table cell shown as it is (never read as Rich markup)."""
    if isinstance(value, Text):
        return value
    return Text("" if value is None else str(value))


def new_table(*columns: str, title: str | None = None, keys: tuple[str, ...] = ()) -> Table:
    """A table whose long cells wrap, a word longer than its column folding onto the next
    line rather than being cut. The `keys` columns (ids, refs, keys) do not wrap: they keep
    their width while any other column can give way, and even then fold rather than end in
    an ellipsis. Piped or redirected, the table has no box-drawing characters."""
    plain = not console.is_terminal
    table = Table(
        title=title,
        box=None if plain else box.SIMPLE_HEAD,
        show_edge=False,
        title_justify="left",
        pad_edge=False,
        collapse_padding=not plain,
    )
    for name in columns:
        if name in keys:
            table.add_column(name, no_wrap=True, overflow="fold")
        else:
            table.add_column(name, overflow="fold")
    return table


def _narrowest(name: str, cells: tuple[Text, ...], key: bool) -> int:
    """The narrowest a column can be without splitting a word (for a key, a line)."""
    texts = [name, *(c.plain for c in cells)]
    parts = [line for t in texts for line in t.splitlines()] if key else " ".join(texts).split()
    return max((len(p) for p in parts), default=1)


def records_table(
    columns: tuple[str, ...],
    rows: list[tuple[object, ...]],
    *,
    title: str | None = None,
    keys: tuple[str, ...] = (),
) -> Table:
    """Records one row each while that fits the console without splitting a word;
    otherwise one record after the other, a field per line (like psql's expanded mode),
    so 80 columns stay readable."""
    cells = [tuple(_cell(v) for v in row) for row in rows]
    by_column = [tuple(row[i] for row in cells) for i in range(len(columns))]
    needed = sum(
        _narrowest(name, column, name in keys)
        for name, column in zip(columns, by_column, strict=True)
    )
    if needed + 2 * (len(columns) - 1) <= console.width:
        table = new_table(*columns, title=title, keys=keys)
        for row in cells:
            table.add_row(*row)
        return table
    table = new_table("field", "value", title=title)
    table.show_header = False
    for i, row in enumerate(cells):
        if i:
            table.add_row("", "")
        for name, value in zip(columns, row, strict=True):
            table.add_row(Text(name, style="bold"), value)
    return table


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


def history_tables(history: History) -> list[Table]:
    op = history.operation
    summary = new_table("field", "value", title=f"operation {op.id}")
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
        "idempotency_key",
        "provider_result_id",
        "lease_owner",
        "lease_expires_at",
        "next_check_at",
        "created_at",
        "updated_at",
    ):
        summary.add_row(_cell(name), _cell(getattr(op, name)))
    attempts = records_table(
        (
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
        ),
        [
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
        ],
        title="attempts",
        keys=("key",),
    )
    evidence = records_table(
        ("at", "source", "verdict", "applied", "binding", "detail"),
        [
            (
                _when(e.recorded_at),
                e.source,
                e.verdict,
                "yes" if e.applied else "no (kept)",
                e.binding.model_dump_json(exclude_none=True),
                json.dumps(e.detail, ensure_ascii=False, default=str)[:300],
            )
            for e in history.evidence
        ],
        title="evidence",
    )
    transitions = records_table(
        ("at", "from", "to", "fence", "by", "reason"),
        [
            (
                _when(t.at),
                t.from_status.value if t.from_status else "",
                t.to_status.value,
                t.fence,
                t.actor,
                t.reason,
            )
            for t in history.transitions
        ],
        title="transitions",
    )
    return [summary, attempts, evidence, transitions]


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


def parse_age(text: str) -> timedelta:
    """'90s', '15m', '2h', '3d' -> timedelta."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return timedelta(seconds=float(text[:-1]) * units[text[-1]])
    except (KeyError, ValueError, IndexError):
        raise typer.BadParameter(f"{text!r}: use a number and s, m, h or d (e.g. 2h)") from None


TenantOption = Annotated[str, typer.Option(help="The tenant you act for (required).")]
OperatorOption = Annotated[str, typer.Option(help="Your name, for the audit trail.")]


@review_app.command("list")
def review_list(
    tenant: TenantOption,
    older_than: Annotated[
        str | None, typer.Option(help="Only reviews older than, e.g. 2h.")
    ] = None,
    action: Annotated[str | None, typer.Option(help="An action, or a prefix ending in *.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, oldest first.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """Open reviews of one tenant, oldest first."""
    age = parse_age(older_than) if older_than else None
    with open_ledger() as ledger:
        rows = ledger.reviews.list(tenant=tenant, older_than=age, action=action, limit=limit)
    if as_json:
        emit_json([r.model_dump(mode="json") for r in rows])
        return
    table = records_table(
        ("op", "action", "target", "opened", "reason"),
        [(r.op_id, r.action, r.target, _when(r.opened_at), r.reason) for r in rows],
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
    if as_json:
        emit_json(view.model_dump(mode="json") | {"payload": payload})
        return
    console.print(f"[bold]review of {op_id}[/bold] opened {_when(view.review.opened_at)}")
    console.print(Text(f"reason: {view.review.reason}"))
    history = History(
        operation=view.operation,
        attempts=view.attempts,
        evidence=view.evidence,
        transitions=(),
        reviews=(view.review,),
    )
    for table in history_tables(history)[:3]:
        console.print(table)
    if payload is None:
        console.print(
            Text(
                "payload: purged (finished operations' frozen payloads are deleted after "
                "OPLEDGER_PAYLOAD_RETENTION_DAYS); only its digest is left: "
                f"{view.operation.payload_digest}",
                overflow="fold",
            )
        )
    else:
        console.print("payload, frozen when prepared (every attempt sends exactly this):")
        text = json.dumps(payload, indent=2, sort_keys=True, ensure_ascii=False)
        console.print(Text(text, overflow="fold"))
    if view.contract is not None:
        console.print(Text(f"provider contract: {view.contract.provider}"))
        for fact in contract_facts(view.contract):
            console.print(Text(f"  - {fact}"))
    hint = view.review.snapshot.get("search_hint")
    if hint:
        console.print(Text(f"to check by hand: {hint}"))
    effects = new_table("resolution", "what it could cause", title="consequences")
    if view.consequences is None:
        effects.add_row("all", "no adapter contract is known for this action: judge with care")
    else:
        e = view.consequences
        effects.add_row("confirmed", _cell(e.confirmed))
        effects.add_row("rejected", _cell(e.rejected))
        no_dedup = view.contract is not None and view.contract.idempotency.kind == "none"
        effects.add_row("retry --accept-risk" if no_dedup else "retry", _cell(e.retry))
        if not no_dedup:
            effects.add_row("retry --new-key", _cell(e.retry_new_key))
        effects.add_row("cancel", _cell(e.cancel))
    console.print(effects)
    console.print(Text(f"shown to {operator} at version {view.operation.record_version}"))


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
    as_: Annotated[Resolution, typer.Option("--as", help="confirmed, rejected, retry or cancel.")],
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
    stands and the sweep sends the retry when the broker is back (exit 0)."""
    with open_ledger() as ledger:
        after = ledger.reviews.resolve(
            op_id,
            tenant=tenant,
            operator=operator,
            resolution=as_,
            note=note,
            evidence=evidence,
            new_key=new_key,
            acknowledge_risk=accept_risk,
            override_evidence=override_evidence,
        )
    unpublished = publish_retry(op_id, debug=debugging(ctx)) if as_ is Resolution.RETRY else None
    if as_ is not Resolution.RETRY:
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
        ledger.get(op_id)  # an unknown operation is refused, not an empty trail
        actions = ledger.reviews.audit(op_id, tenant=tenant)
    if as_json:
        emit_json([a.model_dump(mode="json") for a in actions])
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


ByOption = Annotated[str, typer.Option("--by", help="Your name, for the audit trail.")]


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
            admin_url=admin_url,
            allow_remote=allow_remote,
            concurrency_delay_s=concurrency_delay if admin_url else 0.0,
        )
    except UnsafeTarget as exc:
        typer.echo(f"opledger: refused: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(REFUSED) from exc
    finally:
        registry.close()
    colour = {"agrees": "green", "disagrees": "red", "not observed": "yellow"}
    table = records_table(
        ("fact", "declared", "observed", "verdict"),
        [
            (f.fact, f.declared, f.observed, Text(f.verdict, style=colour[f.verdict]))
            for f in findings
        ],
        title=f"contract {adapter.contract.provider} for {action}",
    )
    console.print(table)
    wrong = [f.fact for f in findings if f.verdict == "disagrees"]
    if wrong:
        console.print(f"[red]the contract disagrees with the provider on: {', '.join(wrong)}[/red]")
        raise typer.Exit(1)
    console.print("[green]no disagreement observed[/green]")


# -- the review console ---------------------------------------------------------------------

#: the modules of the `[console]` extra
CONSOLE_MODULES = ("starlette", "uvicorn", "jinja2", "multipart", "argon2")


def require_console_extra(command: str) -> None:
    """One line naming the extra to install when the console's dependencies are missing."""
    import importlib.util

    for name in CONSOLE_MODULES:
        if importlib.util.find_spec(name) is None:
            err_console.print(
                f"opledger {command}: the review console needs the console extra ({name} is "
                "missing): pip install 'opledger[console]'",
                style="red",
                markup=False,
            )
            raise typer.Exit(4)


OPERATOR_HINT = "opledger operator add NAME --tenant TENANT --by YOU"


@app.command("console")
def console_command(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port.")] = 8700,
    idle_minutes: Annotated[
        float, typer.Option(help="A session ends after this long without a request.")
    ] = 30.0,
    session_hours: Annotated[float, typer.Option(help="Any session ends after this long.")] = 8.0,
    trusted_header: Annotated[
        str | None,
        typer.Option(
            help="SSO mode: the header a proxy sets to the signed-in operator's name (e.g. "
            "X-Forwarded-User); password sign-in is then off."
        ),
    ] = None,
    trusted_proxy: Annotated[
        list[str] | None,
        typer.Option(help="An address or network the SSO proxy connects from (repeat)."),
    ] = None,
    secure_cookies: Annotated[
        bool, typer.Option("--secure-cookies", help="Cookies only over HTTPS (behind TLS).")
    ] = False,
    redact: Annotated[
        list[str] | None,
        typer.Option(help="Hide payload fields of an action: 'crm.*=note,customer.email'."),
    ] = None,
) -> None:
    """The review queue in a browser: the same rules and audit trail as `opledger review`.

    Operators sign in with the accounts `opledger operator add` creates (or, with
    --trusted-header, through an SSO proxy); it refuses to start without one."""
    require_console_extra("console")
    import uvicorn

    from opledger.console.accounts import Accounts
    from opledger.console.app import ConsoleConfig, create_app
    from opledger.console.redaction import Redaction

    if idle_minutes <= 0 or session_hours <= 0:
        raise typer.BadParameter("session times must be positive")
    config = ConsoleConfig(
        idle_timeout=timedelta(minutes=idle_minutes),
        session_lifetime=timedelta(hours=session_hours),
        trusted_header=trusted_header,
        trusted_proxies=tuple(trusted_proxy or ("127.0.0.1", "::1")),
        secure_cookies=secure_cookies,
        redaction=Redaction.parse(redact or ()),
    )
    with open_ledger(pool_size=4) as ledger:
        accounts = Accounts(ledger.engine)
        if accounts.enabled_count() == 0:
            err_console.print(
                f"opledger console: no operator accounts: add one with `{OPERATOR_HINT}`",
                style="red",
                markup=False,
            )
            raise typer.Exit(4)
        web = create_app(
            ledger, accounts, config, publish_retry=lambda op_id: publish_retry(op_id, debug=False)
        )
        mode = f"SSO header {trusted_header}" if trusted_header else "operator passwords"
        err_console.print(f"opledger console on http://{host}:{port} ({mode})", markup=False)
        uvicorn.run(web, host=host, port=port, log_level="warning", proxy_headers=False)


def _read_password(password_stdin: bool) -> str:
    if password_stdin:
        line = sys.stdin.readline()
        return line[:-1] if line.endswith("\n") else line
    if not sys.stdin.isatty():
        raise typer.BadParameter(
            "no terminal to ask for the password: pass it on stdin with --password-stdin, or "
            "use --sso-only"
        )
    password: str = typer.prompt("password", hide_input=True, confirmation_prompt=True)
    return password


@operator_app.command("add")
def operator_add(
    name: Annotated[str, typer.Argument(help="The operator's name, as the audit trail shows it.")],
    by: ByOption,
    tenant: Annotated[
        list[str] | None, typer.Option(help="A tenant this operator acts for (repeat).")
    ] = None,
    all_tenants: Annotated[
        bool, typer.Option("--all-tenants", help="Acts for every tenant (an admin).")
    ] = False,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password from stdin's first line.")
    ] = False,
    sso_only: Annotated[
        bool,
        typer.Option("--sso-only", help="No password: signs in only through the SSO proxy."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Add an operator of the review console (the password is asked for, hidden, unless
    --password-stdin or --sso-only); only its argon2 hash is stored."""
    require_console_extra("operator add")
    from opledger.console.accounts import Accounts

    if sso_only and password_stdin:
        raise typer.BadParameter("--sso-only takes no password")
    password = None if sso_only else _read_password(password_stdin)
    with open_ledger() as ledger:
        added = Accounts(ledger.engine).add(
            name, tenants=tenant or [], all_tenants=all_tenants, password=password, by=by
        )
    if as_json:
        emit_json(added.model_dump(mode="json"))
        return
    how = "through the SSO proxy only" if sso_only else "with a password"
    console.print(Text(f"operator {added.name} added: acts for {added.scope}, signs in {how}"))


@operator_app.command("disable")
def operator_disable(
    name: Annotated[str, typer.Argument(help="The operator's name.")],
    by: ByOption,
    as_json: JsonOption = False,
) -> None:
    """Disable an operator: their sessions end at once; the audit trail keeps the name."""
    require_console_extra("operator disable")
    from opledger.console.accounts import Accounts

    with open_ledger() as ledger:
        disabled = Accounts(ledger.engine).disable(name, by=by)
    if as_json:
        emit_json(disabled.model_dump(mode="json"))
        return
    console.print(Text(f"operator {disabled.name} disabled {_when(disabled.disabled_at)}"))


@operator_app.command("list")
def operator_list(as_json: JsonOption = False) -> None:
    """Operators of the review console, disabled ones too."""
    require_console_extra("operator list")
    from opledger.console.accounts import Accounts

    with open_ledger() as ledger:
        operators = Accounts(ledger.engine).list()
    if as_json:
        emit_json([o.model_dump(mode="json") for o in operators])
        return
    console.print(
        records_table(
            ("name", "tenants", "sign-in", "added", "by", "disabled"),
            [
                (
                    o.name,
                    o.scope,
                    "password" if o.has_password else "SSO only",
                    _when(o.created_at),
                    o.created_by,
                    _when(o.disabled_at),
                )
                for o in operators
            ],
            keys=("name",),
        )
    )


@app.command()
def check(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON document.")] = False,
    broker: Annotated[bool, typer.Option(help="Check the broker too.")] = True,
) -> None:
    """Check the setup, one line each: settings, adapters, Postgres, schema, open
    operations' adapters, beat lock, broker. Exit 0 when all pass, 4 when one fails.
    Nothing is created or changed."""
    from .checks import failures, run_checks

    checks = run_checks(broker=broker)
    if json_output:
        import json

        typer.echo(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for item in checks:
            typer.echo(item.line())
    if failures(checks):
        raise typer.Exit(4)


@app.command()
def sandbox(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port for the CRM and email APIs (0: any).")] = 0,
    smtp_port: Annotated[int, typer.Option(help="SMTP port (0: any).")] = 0,
) -> None:
    """Run the sandbox CRM, email API and SMTP server until interrupted."""
    try:
        from opledger.dev.sandbox.__main__ import serve
    except ImportError as exc:  # a production install: the servers are an extra
        console.print(
            f"the sandbox needs the sandbox extra ({exc.name} is missing): "
            "pip install 'opledger[sandbox]'",
            style="red",
            markup=False,
        )
        raise typer.Exit(4) from exc

    serve(host, port, smtp_port)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    concurrency: Annotated[
        int | None, typer.Option("--concurrency", "-c", help="Processes (default: one per core).")
    ] = None,
    queues: Annotated[
        str, typer.Option(help="Queues to consume.")
    ] = "dispatch,reconcile,maintenance,notifications",
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    hostname: Annotated[str | None, typer.Option(help="Worker node name (-n).")] = None,
) -> None:
    """Run a Celery worker for opledger's tasks (scale by running more of them).

    The startup checks run first (`opledger check`); options after `--` go to Celery's own
    worker unchanged, e.g. `opledger worker -- --max-tasks-per-child 100`."""
    preflight("worker", declare=True)
    from opledger.tasks.app import app as celery_app

    argv = ["worker", "-Q", queues, "--loglevel", loglevel, "-E"]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if hostname:
        argv += ["-n", hostname]
    celery_app.worker_main(argv + list(ctx.args))


@app.command()
def beat(
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "INFO",
    schedule: Annotated[str, typer.Option(help="Where beat keeps its schedule state.")] = "",
) -> None:
    """Run the beat scheduler (sweep, relay, purge). Refuses to start if one already runs."""
    preflight("beat", declare=True)
    from opledger.cli.beatlock import BeatLock, BeatLockTaken
    from opledger.tasks.app import app as celery_app

    path = Path(schedule) if schedule else devstack.STATE_DIR / "celerybeat-schedule"
    try:  # beat keeps its schedule there: find out now, not after it said ready
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.writable"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        err_console.print(
            f"opledger beat: cannot write the beat schedule in {path.parent}: "
            f"{exc.strerror or exc} (pass --schedule PATH, or set OPLEDGER_STATE_DIR)",
            style="red",
            markup=False,
        )
        raise typer.Exit(4) from None
    try:
        lock = BeatLock(database_url())
    except BeatLockTaken as exc:
        err_console.print(f"opledger beat: {exc}; exactly one may run", style="red")
        raise typer.Exit(4) from exc
    try:
        celery_app.start(["beat", "--loglevel", loglevel, "--schedule", str(path.resolve())])
    finally:
        lock.release()


@app.command()
def flower(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 5555,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Run Flower against opledger's workers, behind basic auth from the settings: every
    page, the API, /metrics and /healthcheck alike."""
    ensure_services()
    from opledger.cli.flower_auth import require_auth_everywhere
    from opledger.tasks.app import app as celery_app

    settings = get_settings()
    if not settings.flower_password:
        console.print("[red]set OPLEDGER_FLOWER_PASSWORD: Flower never runs without auth[/red]")
        raise typer.Exit(2)
    try:
        require_auth_everywhere()
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    celery_app.start(
        [
            "flower",
            f"--port={port}",
            f"--address={address}",
            f"--basic-auth={settings.flower_user}:{settings.flower_password}",
        ]
    )


@app.command()
def metrics(
    port: Annotated[int, typer.Option(help="HTTP port.")] = 9464,
    address: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
) -> None:
    """Serve Prometheus metrics on /metrics: the ledger's gauges (read on each scrape) and
    the workers' counters (from PROMETHEUS_MULTIPROC_DIR), behind Flower's basic auth."""
    try:
        from opledger.observability.server import make_server
    except ImportError as exc:  # a production install without the extra
        err_console.print(
            f"opledger metrics: needs the metrics extra ({exc.name} is missing): "
            "pip install 'opledger[metrics]'",
            style="red",
            markup=False,
        )
        raise typer.Exit(4) from None
    settings = get_settings()
    if not settings.flower_password:
        err_console.print(
            "opledger metrics: set OPLEDGER_FLOWER_PASSWORD: the metrics never run without "
            "auth (the same credentials as Flower)",
            style="red",
            markup=False,
        )
        raise typer.Exit(2)
    from sqlalchemy import create_engine

    from opledger.ledger.migrate import sqlalchemy_url

    engine = create_engine(sqlalchemy_url(database_url()), pool_size=1, pool_pre_ping=True)
    server = make_server(
        engine,
        user=settings.flower_user,
        password=settings.flower_password,
        address=address,
        port=port,
    )
    typer.echo(f"opledger metrics on http://{address}:{server.server_port}/metrics", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        engine.dispose()


@app.command()
def chaos(
    ops: Annotated[int, typer.Option(help="Operations to drive through the workers.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the breakage schedule.")] = 1,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    fault_rate: Annotated[
        float, typer.Option(help="Share of operations with a provider fault.")
    ] = 0.25,
    kill_every: Annotated[float, typer.Option(help="Mean seconds between worker kills.")] = 2.0,
    redis_restarts: Annotated[
        int, typer.Option(help="Broker restarts (queued messages lost).")
    ] = 1,
    restart_postgres: Annotated[
        bool, typer.Option("--restart-postgres", help="Also restart Postgres (embedded server).")
    ] = False,
    chaos_seconds: Annotated[float, typer.Option(help="How long things keep breaking.")] = 20.0,
    settle_timeout: Annotated[
        float, typer.Option(help="Then how long it may take to settle.")
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    broker: Annotated[
        str,
        typer.Option(
            help="redis (a private server) or rabbitmq (a private vhost on the local "
            "RabbitMQ, made with rabbitmqctl; a restart deletes and re-adds it)."
        ),
    ] = "redis",
) -> None:
    """Drive operations through real workers while killing them, injecting provider faults
    and restarting the broker (and Postgres); then audit duplicates, races, stuck and lost."""
    import json

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from opledger.dev.chaos.run import ChaosConfig, run_chaos
    from opledger.dev.chaos.stack import Interrupted, stop_on_signals

    config = ChaosConfig(
        ops=ops,
        seed=seed,
        workers=workers,
        fault_rate=fault_rate,
        kill_every=kill_every,
        redis_restarts=redis_restarts,
        restart_postgres=restart_postgres,
        chaos_seconds=chaos_seconds,
        settle_timeout=settle_timeout,
        broker=broker,
    )
    if broker not in ("redis", "rabbitmq"):
        typer.echo(f"opledger: --broker must be redis or rabbitmq (got {broker!r})", err=True)
        raise typer.Exit(2)
    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]chaos[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=err,
        transient=as_json,
    ) as bar:
        task = bar.add_task("settled", total=ops, note="")

        def progress(done: int, total: int, counters: dict[str, int]) -> None:
            note = (
                f"kills {counters['kills']} · redis {counters['redis']} · pg {counters['postgres']}"
            )
            bar.update(task, completed=done, total=total, note=note)

        with stop_on_signals():
            try:
                result = run_chaos(config, progress=progress)
            except Interrupted as stop:
                err.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
                raise typer.Exit(stop.exit_code) from None
    summary = result.summary()
    if as_json:
        print(json.dumps(summary))
    else:
        table = Table("measure", "value", title=f"chaos run, seed {seed}")
        for key, value in summary.items():
            if key != "problems":
                table.add_row(key, str(value))
        console.print(table)
        for problem in summary["problems"]:
            console.print(f"[red]{problem}[/red]")
    if not result.clean:
        raise typer.Exit(1)


@app.command()
def demo(
    keep: Annotated[
        bool,
        typer.Option(
            "--keep", help="Leave the stack running, with Flower from the start; print URLs."
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Also print a JSON summary.")] = False,
) -> None:
    """The onboarding story, then the same story broken at every crash window."""
    import json
    import time

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column

    from opledger.dev.chaos.stack import Interrupted, stop_on_signals
    from opledger.dev.demo import Row, planned_scenarios, run_demo

    started = time.monotonic()
    console.print(
        "[bold]opledger demo[/bold]: an agent closes case-318 in the CRM and emails the "
        "account owner — two operations — on real Postgres, Redis, Celery workers and beat, "
        "and sandbox providers. Then the workers are broken at every crash window.\n"
    )
    table = Table("scenario", "what was broken", "final status", "provider effects", "review")
    bar = Progress(
        SpinnerColumn(),
        TimeElapsedColumn(),
        BarColumn(bar_width=12),
        MofNCompleteColumn(),
        TextColumn(
            "scenarios · {task.description}",
            table_column=Column(no_wrap=True, overflow="ellipsis"),
        ),
        console=console,
        transient=True,
    )
    task = bar.add_task("starting", total=planned_scenarios())

    def on_phase(text: str, done: int, total: int) -> None:
        bar.update(task, description=text, completed=done, total=total)
        if not console.is_terminal:  # no live bar in a log: one line per phase
            console.print(f"[dim]{time.monotonic() - started:5.1f}s {text}[/dim]")

    def on_row(row: Row) -> None:
        console.print(f"[dim]... {row.scenario}[/dim]")
        table.add_row(row.scenario, row.broken, row.outcome, row.effects, row.review)

    with stop_on_signals(), bar:
        try:
            summary = run_demo(keep=keep, on_row=on_row, on_phase=on_phase)
        except Interrupted as stop:
            bar.stop()
            console.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
            raise typer.Exit(stop.exit_code) from None
    console.print(table)
    duplicates = summary["duplicate_effects"]
    style = "green" if duplicates == 0 and not summary["stuck"] and not summary["lost"] else "red"
    console.print(
        f"[{style}]{summary['ops']} operations: {duplicates} duplicate effects, "
        f"{summary['dispatches_while_in_flight']} sends while a call was in flight, "
        f"{summary['stuck']} stuck, {summary['lost']} lost; {summary['unknown_in_review']} "
        f"held for a person to decide.[/{style}]"
    )
    for problem in summary["problems"]:
        console.print(f"[red]{problem}[/red]")
    if keep:
        console.print("\n[bold]Still running[/bold] (Flower saw every task above):")
        for name, url in summary["urls"].items():
            console.print(f"{name}: {url}", soft_wrap=True)
    else:
        console.print(
            f"[dim]{time.monotonic() - started:.0f} s; every process stopped, every temporary "
            "file removed.[/dim]"
        )
    console.print(
        "The same story told by an agent: examples/langgraph_onboarding.py runs it as a "
        "LangGraph graph whose thread is killed, replayed and forked without repeating an "
        'effect (README, "Agents").'
    )
    if as_json:
        print(json.dumps({k: v for k, v in summary.items() if k != "urls"}))
    if style == "red":
        raise typer.Exit(1)


@app.command()
def bench(
    quick: Annotated[
        bool, typer.Option("--quick", help="A smaller run (under two minutes).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    concurrency: Annotated[
        int | None, typer.Option(help="Worker processes for both runs (default: cores).")
    ] = None,
    tasks: Annotated[int | None, typer.Option(help="Tasks per throughput run.")] = None,
    sizes: Annotated[
        str | None, typer.Option(help="Ledger sizes for the sweeps, e.g. 10000,1000000.")
    ] = None,
    prepares: Annotated[int | None, typer.Option(help="Prepares per rate measure.")] = None,
    repeats: Annotated[int | None, typer.Option(help="Timed sweeps per size.")] = None,
    backlog: Annotated[
        int | None,
        typer.Option(help="Prepared operations in the backlog drains (0: skip them)."),
    ] = None,
    backlog_only: Annotated[
        bool, typer.Option("--backlog-only", help="Only the backlog drains.")
    ] = False,
    concurrencies: Annotated[
        str | None,
        typer.Option(help="Concurrencies to measure the ratio at too, e.g. 2,4,8 (0: none)."),
    ] = None,
    tenants: Annotated[
        str | None,
        typer.Option(
            help="Tenant counts to spread the ledger's drain over, e.g. 1,10,100 (0: none)."
        ),
    ] = None,
) -> None:
    """Measure the ledger beside bare Celery (throughput ratio, CPU per operation, round
    trips, sweep cost), and a backlog behind a slow provider drained with and without
    relay and sweep."""
    import dataclasses
    import json

    from opledger.dev.bench import QUICK, BenchConfig, run_bench
    from opledger.dev.chaos.stack import Interrupted, stop_on_signals

    config = QUICK if quick else BenchConfig()
    changes: dict[str, Any] = {
        "concurrency": concurrency,
        "tasks": tasks,
        "prepares": prepares,
        "repeats": repeats,
    }
    if sizes:
        two = _counts("--sizes", sizes)
        if len(two) != 2:
            raise typer.BadParameter("give two sizes, small and large, e.g. 10000,1000000")
        changes["sizes"] = (two[0], two[1])
    if concurrencies is not None:
        changes["concurrencies"] = tuple(c for c in _counts("--concurrencies", concurrencies) if c)
    if tenants is not None:
        changes["tenants"] = tuple(t for t in _counts("--tenants", tenants) if t)
    config = dataclasses.replace(
        config, **{k: v for k, v in changes.items() if v is not None and v != 0}
    )
    if backlog is not None:
        config = dataclasses.replace(config, backlog=backlog)
    config = dataclasses.replace(config, backlog_only=backlog_only)
    err = Console(stderr=True)
    with stop_on_signals():
        try:
            result = run_bench(config, progress=lambda m: err.print(f"[dim]{m}[/dim]"))
        except Interrupted as stop:
            err.print(f"[red]{stop}: every process stopped, temporary files removed[/red]")
            raise typer.Exit(stop.exit_code) from None
    if as_json:
        print(json.dumps(result))
        return
    table = Table("measure", "value", "target")
    targets = {
        "backlog_ratio": ">= 0.9",
        "backlog_msgs_per_op_max": "<= 1.5",
        "backlog_wipe_settled": f"= {config.backlog}",
        "ratio": ">= 0.8",
        "round_trips_per_op": "<= 2",
        "sweep_ms_1m": f"<= 2 x sweep_ms_10k = {2 * result['sweep_ms_10k']:.1f}",
    }
    for key, value in result.items():
        if key in ("by_concurrency", "ledger_ops_s_by_tenants"):
            continue
        if key != "sweep_plans":
            table.add_row(key, str(value), targets.get(key, ""))
    for c, row in result.get("by_concurrency", {}).items():
        table.add_row(f"ratio at concurrency {c}", str(row["ratio"]), ">= 0.8")
    for t, ops in result.get("ledger_ops_s_by_tenants", {}).items():
        table.add_row(f"ledger_ops_s with {t} tenants", str(ops), "")
    console.print(table)
    for size, plans in result.get("sweep_plans", {}).items():
        for name, plan in plans.items():
            console.print(f"[dim]{size} {name}: {plan}[/dim]")


def _counts(option: str, text: str) -> list[int]:
    """A comma-separated list of non-negative whole numbers, or a usage error."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"{option} takes whole numbers separated by commas") from None
    if not values or any(v < 0 for v in values):
        raise typer.BadParameter(f"{option} takes whole numbers separated by commas")
    return values


def main() -> None:
    app()
