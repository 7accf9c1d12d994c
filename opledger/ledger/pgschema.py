"""The Postgres schema the ledger lives in, and engines whose connections use it.

Every table, function, trigger and type of the ledger lives in one schema of its own
(`opledger` unless `OPLEDGER_DATABASE_SCHEMA` says otherwise), so it can share a database
with an application's tables without a name of either colliding. The ledger's statements
name their tables unqualified: each connection the ledger uses sets its `search_path` to
that schema alone (no `public` behind it, so a table missing from the schema is an error,
never an application's table of the same name), and the trigger functions pin the same
path, so they act on the ledger's tables whoever's session fires them. Engines and
connections themselves are made by `connector`.
"""

from __future__ import annotations

import hashlib
import os
import re
import weakref
from typing import Any

from sqlalchemy import Engine, event

from .errors import InvalidInput

#: the schema a ledger lives in when nothing says otherwise
DEFAULT_SCHEMA = "opledger"

#: the setting that names it (read by every process: workers, beat, console, CLI, agents)
SCHEMA_VARIABLE = "OPLEDGER_DATABASE_SCHEMA"

#: a schema name that needs no quoting anywhere: lower case, an unreserved-looking
#: identifier of at most 63 bytes (Postgres's limit), never one of Postgres's own
_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_RESERVED_PREFIX = "pg_"


def check_schema(name: object) -> str:
    """`name` as a schema the ledger may use, or `InvalidInput` saying why not."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(
            f"{SCHEMA_VARIABLE} must be a lower-case Postgres identifier (letters, digits and "
            f"'_', at most 63, not starting with a digit), not {name!r}",
            field=SCHEMA_VARIABLE,
        )
    if name.startswith(_RESERVED_PREFIX) or name == "information_schema":
        raise InvalidInput(
            f"{SCHEMA_VARIABLE} cannot be {name!r}: that name belongs to Postgres itself",
            field=SCHEMA_VARIABLE,
        )
    return name


def schema_from_environment() -> str:
    """The schema `OPLEDGER_DATABASE_SCHEMA` names (default `opledger`), as every process
    reads it; only that variable, so an unrelated setting cannot stop a ledger opening."""
    raw = os.environ.get(SCHEMA_VARIABLE, "").strip()
    return check_schema(raw) if raw else DEFAULT_SCHEMA


def search_path(schema: str) -> str:
    """The `search_path` a ledger connection runs with: its schema alone."""
    return f'"{check_schema(schema)}"'


_USED: dict[int, str] = {}


def use_schema(engine: Engine, schema: str) -> None:
    """Make every connection `engine` opens from now on run with `schema` as its whole
    `search_path` (before the dialect's first look at the server, so SQLAlchemy's default
    schema is the ledger's too). Once per engine; another schema for the same engine is
    refused, since its pooled connections would already point at the first."""
    path = search_path(schema)
    held = _USED.get(id(engine))
    if held is not None:
        if held != schema:
            raise InvalidInput(
                f"this engine already serves the ledger in schema {held!r}, not {schema!r}",
                field=SCHEMA_VARIABLE,
            )
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET search_path TO {path}")
        dbapi_connection.autocommit = autocommit

    event.listen(engine, "connect", on_connect, insert=True)
    _USED[id(engine)] = schema
    # forget the engine with it (ids are reused once an engine is collected)
    weakref.finalize(engine, _USED.pop, id(engine), None)


def schema_of(engine: Engine) -> str | None:
    """The schema `use_schema` set for `engine`, if any."""
    return _USED.get(id(engine))


#: the beat's advisory lock key for a ledger in `public`, where every deployment lived before
#: the ledger had a schema of its own: kept, so an old beat and a new one still exclude
#: each other while such a deployment is upgraded in place
LEGACY_BEAT_LOCK_KEY = 0x6F706C6564676572  # "opledger"


def beat_lock_key(schema: str) -> int:
    """The advisory lock key (a positive bigint) that makes the beat of the ledger in
    `schema` the only one: ledgers in two schemas of one database each have their beat."""
    if schema == "public":
        return LEGACY_BEAT_LOCK_KEY
    digest = hashlib.sha256(f"opledger beat {check_schema(schema)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


def lock_words(key: int) -> dict[str, int]:
    """`key` as `pg_locks` shows a one-bigint advisory lock: `classid` (its high 32 bits)
    and `objid` (its low ones), with `objsubid` 1."""
    return {"hi": key >> 32, "lo": key & 0xFFFFFFFF}
