"""Apply the ledger's Alembic migrations from code (no alembic.ini needed), in its schema.

`opledger migrate` is the one command that creates anything: the schema (`opledger`
unless `OPLEDGER_DATABASE_SCHEMA` names another), its tables, functions, triggers and
type, and Alembic's version table inside it. It refuses to start a second, empty ledger
beside one that already holds operations in another schema of the same database (a
deployment from before the ledger had a schema of its own lives in `public`): that one is
moved, with its history, by `move_schema` (`opledger migrate --from-schema public`).
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, pool, text

from .errors import LedgerError
from .pgschema import ledger_engine, schema_from_environment, search_path, sqlalchemy_url
from .schema import metadata

if TYPE_CHECKING:  # Alembic is imported when migrating, not by every user of the ledger
    from alembic.config import Config

__all__ = [
    "SchemaConflict",
    "alembic_config",
    "downgrade",
    "ledger_schemas",
    "move_schema",
    "sqlalchemy_url",
    "upgrade",
]

#: the version table Alembic keeps, inside the ledger's schema
VERSION_TABLE = "alembic_version"

#: tables whose presence marks a schema as holding a ledger
_MARKERS = ("operations", "transitions", VERSION_TABLE)


class SchemaConflict(LedgerError):
    """The ledger's schema cannot be created or moved as asked."""


def alembic_config(url: str, schema: str | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations, at `url` and at `schema`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("opledger.ledger") / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    config.attributes["schema"] = schema or schema_from_environment()
    return config


def upgrade(url: str, revision: str = "head", *, schema: str | None = None) -> None:
    """Bring the ledger at `url` to `revision` (default: the newest schema), creating its
    schema when it does not exist yet. Refused (`SchemaConflict`) when the schema holds no
    ledger yet while another schema of the database does."""
    from alembic import command

    config = alembic_config(url, schema)
    _refuse_a_second_ledger(url, config.attributes["schema"])
    command.upgrade(config, revision)


def downgrade(url: str, revision: str, *, schema: str | None = None) -> None:
    """Step the ledger at `url` back to `revision` ('base' drops everything but its
    schema and Alembic's version table)."""
    from alembic import command

    command.downgrade(alembic_config(url, schema), revision)


def ledger_schemas(conn: Connection) -> dict[str, str | None]:
    """Every schema of the database that holds a ledger, with its Alembic revision."""
    rows = conn.execute(
        text(
            "SELECT table_schema FROM information_schema.tables"
            " WHERE table_name = ANY(:markers) GROUP BY table_schema"
            " HAVING count(DISTINCT table_name) = :n"
        ),
        {"markers": list(_MARKERS), "n": len(_MARKERS)},
    ).scalars()
    found: dict[str, str | None] = {}
    for name in rows:
        found[name] = conn.execute(
            text(f'SELECT version_num FROM "{name}".{VERSION_TABLE}')
        ).scalar_one_or_none()
    return found


def _refuse_a_second_ledger(url: str, schema: str) -> None:
    engine = ledger_engine(url, schema=schema, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            found = ledger_schemas(conn)
    finally:
        engine.dispose()
    others = {name: rev for name, rev in found.items() if name != schema}
    if schema in found or not others:
        return
    name, revision = sorted(others.items())[0]
    raise SchemaConflict(
        f'a ledger already lives in schema "{name}" of this database (at revision {revision})'
        f' and schema "{schema}" has none: move it with `opledger migrate --from-schema {name}`'
        f" (its history comes along), or keep it where it is with OPLEDGER_DATABASE_SCHEMA={name}"
    )


def move_schema(url: str, *, source: str, schema: str | None = None) -> str:
    """Move the ledger at `url` from schema `source` (usually `public`, where deployments
    from before the ledger had a schema of its own live) into `schema` with every row of
    its history, in one transaction, then bring it to the newest revision. Returns the
    revision it was moved at. Stop the workers, beat and console first: they would keep
    using the old names until restarted with the new setting.

    Refused, changing nothing, when `source` holds no ledger or `schema` already holds
    one (or any table of the ledger's name)."""
    target = schema or schema_from_environment()
    source = _checked(source)
    if source == target:
        raise SchemaConflict(f'the ledger is already in schema "{target}"')
    engine = ledger_engine(url, schema=target, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            revision = _move(conn, source, target)
    finally:
        engine.dispose()
    upgrade(url, schema=target)
    return revision


def _checked(name: str) -> str:
    search_path(name)  # the same rules as the setting (raises InvalidInput)
    return name


def _move(conn: Connection, source: str, target: str) -> str:
    found = ledger_schemas(conn)
    if source not in found:
        raise SchemaConflict(
            f'schema "{source}" holds no ledger (no operations, transitions'
            f" and {VERSION_TABLE} tables): nothing to move"
        )
    tables = [t.name for t in metadata.sorted_tables] + [VERSION_TABLE]
    present = _names(conn, "SELECT tablename FROM pg_tables WHERE schemaname = :s", source)
    taken = _names(conn, "SELECT tablename FROM pg_tables WHERE schemaname = :s", target)
    clash = sorted(set(tables) & taken)
    if clash:
        raise SchemaConflict(
            f'schema "{target}" already has tables named {", ".join(clash)}: nothing was moved'
        )
    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{target}"'))
    for table in tables:
        if table in present:  # an older revision may not have every table yet
            conn.execute(text(f'ALTER TABLE "{source}".{table} SET SCHEMA "{target}"'))
    if _names(
        conn,
        "SELECT typname FROM pg_type WHERE typnamespace = CAST(:s AS regnamespace)"
        " AND typname = 'op_status'",
        source,
    ):
        conn.execute(text(f'ALTER TYPE "{source}".op_status SET SCHEMA "{target}"'))
    functions = _names(
        conn,
        "SELECT proname FROM pg_proc WHERE pronamespace = CAST(:s AS regnamespace)"
        r" AND proname LIKE 'opledger\_%' AND prorettype = 'trigger'::regtype",
        source,
    )
    for function in sorted(functions):
        conn.execute(text(f'ALTER FUNCTION "{source}".{function}() SET SCHEMA "{target}"'))
        pinned: Any = conn.execute(
            text(
                "SELECT proconfig FROM pg_proc WHERE proname = :f"
                " AND pronamespace = CAST(:s AS regnamespace)"
            ),
            {"f": function, "s": target},
        ).scalar_one()
        if pinned and any(c.startswith("search_path=") for c in pinned):
            conn.execute(
                text(f'ALTER FUNCTION "{target}".{function}() SET search_path = "{target}"')
            )
    revision = found[source]
    return revision or "base"


def _names(conn: Connection, sql: str, schema: str) -> set[str]:
    return set(conn.execute(text(sql), {"s": schema}).scalars())
