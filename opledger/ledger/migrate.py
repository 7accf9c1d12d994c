"""Apply the ledger's Alembic migrations from code (no alembic.ini needed), in its schema.

`opledger migrate` is the one command that creates anything: the schema (`opledger`
unless `OPLEDGER_DATABASE_SCHEMA` names another), its tables, functions, triggers and
type, and Alembic's version table inside it. It refuses to start a second, empty ledger
beside one that already holds operations in another schema of the same database (a
deployment from before the ledger had a schema of its own lives in `public`): that one is
moved, with its history, by `move_schema` (`opledger migrate --from-schema public`).
"""

from __future__ import annotations

import functools
import re
from importlib.resources import files
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, TextClause, pool

from .connector import ledger_engine, sqlalchemy_url
from .errors import LedgerError
from .pgschema import schema_from_environment, search_path
from .queries import catalog as q

if TYPE_CHECKING:  # Alembic is imported when migrating, not by every user of the ledger
    from alembic.config import Config

__all__ = [
    "Migrated",
    "SchemaConflict",
    "alembic_config",
    "downgrade",
    "ledger_schemas",
    "ledger_tables",
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


class Migrated(NamedTuple):
    """What `upgrade` did to the ledger in `schema`: its Alembic revision `before` (None:
    it held no ledger, which was created) and `after`."""

    schema: str
    before: str | None
    after: str | None

    def summary(self) -> str:
        """In one line: created, already at the revision asked for, or upgraded."""
        if self.before is None:
            return f'created the ledger in schema "{self.schema}" at revision {self.after}'
        if self.before == self.after:
            return f'ledger schema "{self.schema}" is at head (revision {self.after}): no change'
        return f'upgraded ledger schema "{self.schema}" from revision {self.before} to {self.after}'


@functools.cache
def ledger_tables() -> tuple[str, ...]:
    """The ledger's tables, in the order `schema.sql` creates them (a table before those
    whose keys refer to it). Read from that file, which `tests/integration/
    test_schema_sql.py` holds to exactly what the migrations build; Alembic's version
    table is not one of them."""
    sql = (files("opledger.ledger") / "schema.sql").read_text()
    return tuple(re.findall(r"^CREATE TABLE (\w+)", sql, flags=re.MULTILINE))


def alembic_config(url: str, schema: str | None = None) -> Config:
    """An Alembic config pointing at the packaged migrations, at `url` and at `schema`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(files("opledger.ledger") / "migrations"))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    config.attributes["schema"] = schema or schema_from_environment()
    return config


def upgrade(url: str, revision: str = "head", *, schema: str | None = None) -> Migrated:
    """Bring the ledger at `url` to `revision` (default: the newest schema), creating its
    schema when it does not exist yet; what it did (its revision before and after).
    Refused (`SchemaConflict`) when the schema holds no ledger yet while another schema of
    the database does."""
    from alembic import command

    config = alembic_config(url, schema)
    target = config.attributes["schema"]
    before = _refuse_a_second_ledger(url, target)
    command.upgrade(config, revision)
    return Migrated(target, before, _ledgers(url, target).get(target))


def downgrade(url: str, revision: str, *, schema: str | None = None) -> None:
    """Step the ledger at `url` back to `revision` ('base' drops everything but its
    schema and Alembic's version table)."""
    from alembic import command

    command.downgrade(alembic_config(url, schema), revision)


def ledger_schemas(conn: Connection) -> dict[str, str | None]:
    """Every schema of the database that holds a ledger, with its Alembic revision."""
    rows = conn.execute(q.SCHEMAS_WITH, {"markers": list(_MARKERS), "n": len(_MARKERS)}).scalars()
    found: dict[str, str | None] = {}
    for name in rows:
        found[name] = conn.execute(q.version_in(name, VERSION_TABLE)).scalar_one_or_none()
    return found


def _ledgers(url: str, schema: str) -> dict[str, str | None]:
    engine = ledger_engine(url, schema=schema, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return ledger_schemas(conn)
    finally:
        engine.dispose()


def _refuse_a_second_ledger(url: str, schema: str) -> str | None:
    """The revision of the ledger in `schema` (None: it holds none yet); refused when it
    holds none while another schema of the database does."""
    found = _ledgers(url, schema)
    others = {name: rev for name, rev in found.items() if name != schema}
    if schema in found or not others:
        return found.get(schema)
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
    tables = [*ledger_tables(), VERSION_TABLE]
    present = _names(conn, q.TABLES_IN, source)
    taken = _names(conn, q.TABLES_IN, target)
    clash = sorted(set(tables) & taken)
    if clash:
        raise SchemaConflict(
            f'schema "{target}" already has tables named {", ".join(clash)}: nothing was moved'
        )
    conn.execute(q.create_schema(target))
    for table in tables:
        if table in present:  # an older revision may not have every table yet
            conn.execute(q.move_table(table, source, target))
    if _names(conn, q.STATUS_TYPE_IN, source):
        conn.execute(q.move_status_type(source, target))
    functions = _names(conn, q.TRIGGER_FUNCTIONS_IN, source)
    for function in sorted(functions):
        conn.execute(q.move_function(function, source, target))
        pinned: Any = conn.execute(q.FUNCTION_SETTINGS, {"f": function, "s": target}).scalar_one()
        if pinned and any(c.startswith("search_path=") for c in pinned):
            conn.execute(q.pin_function(function, target))
    revision = found[source]
    return revision or "base"


def _names(conn: Connection, statement: TextClause, schema: str) -> set[str]:
    return set(conn.execute(statement, {"s": schema}).scalars())
