"""`opledger console` and `opledger operator`: the review console and its accounts."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from opledger.settings import get_settings

from .app import (
    ByOption,
    JsonOption,
    app,
    console,
    emit_json,
    err_console,
    missing_extra,
    open_ledger,
)
from .render import _when, records_table
from .review import publish_retry

if TYPE_CHECKING:
    from opledger.console.app import ConsoleConfig

operator_app = typer.Typer(help="Operators of the review console: accounts and their tenants.")
app.add_typer(operator_app, name="operator")


CONSOLE_MODULES = ("starlette", "uvicorn", "jinja2", "multipart", "argon2")


def require_console_extra(command: str) -> None:
    """One line naming the extra to install when the console's dependencies are missing."""
    import importlib.util

    for name in CONSOLE_MODULES:
        if importlib.util.find_spec(name) is None:
            raise missing_extra(f"opledger: {command}: the review console", "console", name)


OPERATOR_HINT = "opledger operator add NAME --tenant TENANT --by YOU"

ApprovesOption = Annotated[
    list[str] | None,
    typer.Option(help="An action pattern whose acts they may approve, e.g. 'stripe.*' (repeat)."),
]


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
        typer.Option(
            help="An address or network your proxy connects from (repeat); required with "
            "--trusted-header. Its X-Forwarded-For names the client."
        ),
    ] = None,
    secure_cookies: Annotated[
        bool, typer.Option("--secure-cookies", help="Cookies only over HTTPS (behind TLS).")
    ] = False,
    public_url: Annotated[
        str | None,
        typer.Option(
            help="The URL browsers open (https://review.example.com) when a proxy is in "
            "front: forms are accepted only from its pages; https implies --secure-cookies."
        ),
    ] = None,
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
    from opledger.console.app import create_app

    config = _console_config(
        idle_minutes=idle_minutes,
        session_hours=session_hours,
        trusted_header=trusted_header,
        trusted_proxy=trusted_proxy,
        secure_cookies=secure_cookies,
        public_url=public_url,
        redact=redact,
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
        where = f"http://{host}:{port}" + (f", public {config.public_origin}" if public_url else "")
        err_console.print(f"opledger console on {where} ({mode})", markup=False)
        uvicorn.run(web, host=host, port=port, log_level="warning", proxy_headers=False)


def _console_config(
    *,
    idle_minutes: float,
    session_hours: float,
    trusted_header: str | None,
    trusted_proxy: list[str] | None,
    secure_cookies: bool,
    public_url: str | None,
    redact: list[str] | None,
) -> ConsoleConfig:
    """The console's options, checked (a usage error, exit 2, for one that cannot work),
    with the redaction rules and the shared sign-in key of the settings."""
    from opledger.console.app import ConsoleConfig
    from opledger.console.redaction import Redaction
    from opledger.ledger.errors import InvalidInput

    if idle_minutes <= 0 or session_hours <= 0:
        raise typer.BadParameter("session times must be positive")
    if trusted_header and not trusted_proxy:
        raise typer.BadParameter(
            "--trusted-header needs --trusted-proxy ADDRESS (where the SSO proxy connects "
            "from): without it any local process could name any operator"
        )
    try:
        config = ConsoleConfig(
            idle_timeout=timedelta(minutes=idle_minutes),
            session_lifetime=timedelta(hours=session_hours),
            trusted_header=trusted_header,
            trusted_proxies=tuple(trusted_proxy or ()),
            secure_cookies=secure_cookies,
            public_origin=public_url,
            # the same rules as the CLI's (OPLEDGER_REDACT), then the console's own
            redaction=Redaction.configured(get_settings().redact, redact or ()),
        )
        shared = get_settings().console_signin_key
        if shared is not None:  # every console process signs its sign-in forms alike
            config = replace(config, signin_key=shared.get_secret_value().encode())
    except InvalidInput as exc:
        raise typer.BadParameter(str(exc)) from None
    return config


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
    approves: ApprovesOption = None,
    as_json: JsonOption = False,
) -> None:
    """Add an operator of the review console (the password is asked for, hidden, unless
    --password-stdin or --sso-only); only its argon2 hash is stored. With --approves, they
    may approve the acts of those actions that wait for a person (`opledger approvals`)."""
    require_console_extra("operator add")
    from opledger.console.accounts import Accounts

    if sso_only and password_stdin:
        raise typer.BadParameter("--sso-only takes no password")
    password = None if sso_only else _read_password(password_stdin)
    with open_ledger() as ledger:
        added = Accounts(ledger.engine).add(
            name,
            tenants=tenant or [],
            all_tenants=all_tenants,
            password=password,
            by=by,
            approves=approves or [],
        )
    if as_json:
        emit_json(added.model_dump(mode="json"))
        return
    how = "through the SSO proxy only" if sso_only else "with a password"
    console.print(
        Text(
            f"operator {added.name} added: acts for {added.scope}, signs in {how}"
            + _approving(added.approves)
        )
    )


def _approving(patterns: tuple[str, ...]) -> str:
    return f"; approves {', '.join(patterns)}" if patterns else "; approves nothing"


@operator_app.command("update")
def operator_update(
    name: Annotated[str, typer.Argument(help="The operator's name.")],
    by: ByOption,
    approves: ApprovesOption = None,
    approves_nothing: Annotated[
        bool, typer.Option("--approves-nothing", help="Take every approval scope away.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Change what an operator may approve: the action patterns given replace theirs."""
    require_console_extra("operator update")
    from opledger.console.accounts import Accounts

    if approves_nothing == bool(approves):
        raise typer.BadParameter("give --approves PATTERN (repeat) or --approves-nothing")
    with open_ledger() as ledger:
        updated = Accounts(ledger.engine).set_approves(name, approves or [], by=by)
    if as_json:
        emit_json(updated.model_dump(mode="json"))
        return
    console.print(Text(f"operator {updated.name} updated" + _approving(updated.approves)))


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
            ("name", "tenants", "approves", "sign-in", "added", "by", "disabled"),
            [
                (
                    o.name,
                    o.scope,
                    ", ".join(o.approves),
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


@operator_app.command("audit")
def operator_audit(
    name: Annotated[str, typer.Argument(help="The name, as typed at sign-in (known or not).")],
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 50,
    as_json: JsonOption = False,
) -> None:
    """The console's password checks for this name: when, from where, failed or not."""
    require_console_extra("operator audit")
    from opledger.console.accounts import Accounts

    with open_ledger() as ledger:
        attempts = Accounts(ledger.engine).signins(name, limit=limit)
    if as_json:
        emit_json([a.model_dump(mode="json") for a in attempts])
        return
    failed = 0
    for a in attempts:
        if a.ok:
            break
        failed += 1
    console.print(
        records_table(
            ("at", "from", "sign-in"),
            [(_when(a.at), a.address, "ok" if a.ok else "FAILED") for a in attempts],
            keys=("at",),
        )
    )
    more = " or more" if failed == len(attempts) == limit else ""
    console.print(Text(f"{failed}{more} failed sign-in(s) since the last successful one"))
