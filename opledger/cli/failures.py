"""How the `opledger` command fails: one line on stderr and a documented exit code.

- 2: usage (an unknown option, a missing argument, a bad value: Typer's message, on one
  line like the others, `opledger: usage: ...`);
- 3: refused: the ledger said no (a `LedgerError` such as `InvalidInput`,
  `OperationNotFound`, `ReviewError`, `AuthorizationError`, `IntentConflict`); nothing
  changed;
- 4: operational: the database or the broker cannot be reached, the schema is not migrated,
  a setting is missing or invalid.

`--debug` (or `OPLEDGER_DEBUG=1`) prints the traceback instead of the line, with the same
exit code. Anything else is a bug: it is raised as it is, traceback and all (exit 1).

The boundary is the command group itself (`OpledgerGroup.invoke`), so every command, and
the Click test runner, goes through it once.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import typer
from sqlalchemy.engine import make_url
from typer.core import TyperGroup

USAGE = 2
REFUSED = 3
OPERATIONAL = 4


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return _one_line(lines[0]) if lines else type(exc).__name__


def _safe_url(url: str) -> str:
    from opledger.ledger import dsn

    if dsn.is_postgres(url):  # several hosts too, which SQLAlchemy's URL cannot hold
        return dsn.redacted(url)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not even a URL: say so without repeating it (it may hold a secret)
        return "an unparsable URL"


def _setting(name: str) -> str | None:
    from opledger.settings import get_settings

    try:
        value = getattr(get_settings(), name)
    except Exception:  # the settings themselves are invalid: reported on their own
        return None
    return value if isinstance(value, str) and value else None


def _database() -> str:
    url = _setting("database_url")
    if url is None:
        return "OPLEDGER_DATABASE_URL (unset)"
    return f"OPLEDGER_DATABASE_URL={_safe_url(url)}"


def _broker() -> str:
    url = _setting("broker_url")
    if url is None:
        return "OPLEDGER_BROKER_URL (unset)"
    return f"OPLEDGER_BROKER_URL={_safe_url(url)}"


def _is_broker_error(exc: BaseException) -> bool:
    """A kombu or redis connection error (modules looked up only if already imported)."""
    kinds: list[type[BaseException]] = []
    kombu = sys.modules.get("kombu.exceptions")
    if kombu is not None:
        kinds.append(kombu.OperationalError)
    redis = sys.modules.get("redis.exceptions")
    if redis is not None:
        kinds += [redis.ConnectionError, redis.TimeoutError]
    return bool(kinds) and isinstance(exc, tuple(kinds))


def _settings_error(exc: BaseException) -> str | None:
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError) or exc.title != "Settings":
        return None
    first = exc.errors()[0]
    name = "OPLEDGER_" + "_".join(str(part) for part in first["loc"]).upper()
    return f"invalid setting {name}: {first['msg']}"


def describe(exc: BaseException) -> tuple[int, str] | None:
    """The exit code and the one line for an operational failure or a refusal; None for
    anything else (a bug, raised as it is)."""
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from opledger.ledger import DatabaseUnavailable, InvalidInput, LedgerError, SchemaMissing, dsn
    from opledger.settings import NotConfigured

    if isinstance(exc, SchemaMissing):
        return OPERATIONAL, f"{_one_line(exc)} against {_database()}"
    if isinstance(exc, DatabaseUnavailable):
        return OPERATIONAL, f"{_one_line(exc)}: check {_database()} and that Postgres is running"
    if isinstance(exc, InvalidInput) and exc.fields.get("field") == dsn.FIELD:
        # a setting, not a refusal; its reason never repeats the URL (nor its password)
        return (
            OPERATIONAL,
            f"OPLEDGER_DATABASE_URL is not a usable database URL: {exc.fields['reason']}",
        )
    if isinstance(exc, LedgerError):
        return REFUSED, f"refused: {_one_line(exc)}"
    if isinstance(exc, NotConfigured):
        return OPERATIONAL, _one_line(exc)
    if isinstance(exc, DBAPIError):
        return OPERATIONAL, (
            f"the ledger's database failed: {_first_line(exc.orig or exc)}: check {_database()}"
        )
    if isinstance(exc, ArgumentError):
        return (
            OPERATIONAL,
            f"OPLEDGER_DATABASE_URL is not a usable database URL: {_first_line(exc)}",
        )
    if _is_broker_error(exc):
        return OPERATIONAL, (
            f"cannot reach the broker: {_first_line(exc)}: check {_broker()} and that Redis "
            "is running"
        )
    invalid = _settings_error(exc)
    if invalid is not None:
        return OPERATIONAL, invalid
    return None


def debugging(ctx: typer.Context) -> bool:
    """Whether `--debug` (or `OPLEDGER_DEBUG=1`) asked for tracebacks."""
    return bool(ctx.find_root().params.get("debug"))


def report(exc: BaseException, *, debug: bool) -> int | None:
    """Write the failure to stderr (one line, or the traceback when debugging) and return
    its exit code; None when it is no failure this module knows (the caller re-raises)."""
    described = describe(exc)
    if described is None:
        return None
    code, line = described
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    else:
        hint = " (--debug shows the traceback)" if code == OPERATIONAL else ""
        typer.echo(f"opledger: {line}{hint}", err=True)
    return code


#: Typer's usage error (of its vendored Click, or of Click itself in older Typers)
UsageError: type[Exception] = typer.BadParameter.__bases__[0]


def usage_failure(exc: Exception) -> int:
    """Write a usage error (an unknown option, a missing or malformed argument) as one
    line, like every other failure, `opledger: usage: ...` and where the help is, instead
    of Typer's box; return its exit code (2)."""
    message = getattr(exc, "format_message", lambda: str(exc))()
    ctx = getattr(exc, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    typer.echo(f"opledger: usage: {_one_line(message)}{where}", err=True)
    return int(getattr(exc, "exit_code", USAGE))


def _is_usage_error(exc: BaseException) -> bool:
    """A usage error to say in one line; not the one that asks for the help text (a group
    run without a command prints its help)."""
    return isinstance(exc, UsageError) and type(exc).__name__ != "NoArgsIsHelpError"


def _silence_stdout() -> None:
    """After a broken pipe, so that flushing stdout at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (a test runner's stdout)
        pass


#: the order `opledger --help` lists the commands in (one module each registers them)
COMMAND_ORDER = (
    "migrate", "console", "check", "sandbox", "worker", "beat", "flower", "metrics",
    "chaos", "demo", "bench", "ops", "review", "grant", "contract", "adapter", "operator",
    "payloads",
)  # fmt: skip


class OpledgerGroup(TyperGroup):
    """The `opledger` command group: every command's failures pass through `invoke`;
    the help lists the commands in `COMMAND_ORDER`."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda name: rank.get(name, len(rank)))

    def make_context(self, info_name: Any, args: Any, parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except Exception as exc:  # the root's own options: a usage error is one line too
            if _is_usage_error(exc):
                raise typer.Exit(usage_failure(exc)) from None
            raise

    def invoke(self, ctx: Any) -> Any:  # a Click context (vendored by newer Typers)
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # the reader went away (`| head`): stop quietly
            _silence_stdout()
            raise typer.Exit(1) from None
        except Exception as exc:  # exits are none of `describe`'s: re-raised
            if _is_usage_error(exc):
                raise typer.Exit(usage_failure(exc)) from None
            code = report(exc, debug=debugging(ctx))
            if code is None:
                raise
            raise typer.Exit(code) from exc
