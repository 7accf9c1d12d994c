"""What `migrate` reads of Postgres's catalog: which schemas hold a ledger, and what a
schema holds (its tables, the ledger's status type, its trigger functions)."""

from __future__ import annotations

from sqlalchemy import TextClause, text

#: every schema holding all of the tables in :markers (:n of them)
SCHEMAS_WITH = text(
    "SELECT table_schema FROM information_schema.tables"
    " WHERE table_name = ANY(:markers) GROUP BY table_schema"
    " HAVING count(DISTINCT table_name) = :n"
)

#: the tables of schema :s
TABLES_IN = text("SELECT tablename FROM pg_tables WHERE schemaname = :s")

#: the ledger's status type, if schema :s holds it
STATUS_TYPE_IN = text(
    "SELECT typname FROM pg_type WHERE typnamespace = CAST(:s AS regnamespace)"
    " AND typname = 'op_status'"
)

#: the ledger's trigger functions in schema :s
TRIGGER_FUNCTIONS_IN = text(
    "SELECT proname FROM pg_proc WHERE pronamespace = CAST(:s AS regnamespace)"
    r" AND proname LIKE 'opledger\_%' AND prorettype = 'trigger'::regtype"
)

#: the settings function :f of schema :s pins (its `proconfig`)
FUNCTION_SETTINGS = text(
    "SELECT proconfig FROM pg_proc WHERE proname = :f AND pronamespace = CAST(:s AS regnamespace)"
)


# -- moving a ledger from one schema to another (names checked by the caller: `pgschema`)


def version_in(schema: str, version_table: str) -> TextClause:
    """The Alembic revision the ledger in `schema` is at."""
    return text(f'SELECT version_num FROM "{schema}".{version_table}')


def create_schema(schema: str) -> TextClause:
    return text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')


def move_table(table: str, source: str, target: str) -> TextClause:
    return text(f'ALTER TABLE "{source}".{table} SET SCHEMA "{target}"')


def move_status_type(source: str, target: str) -> TextClause:
    return text(f'ALTER TYPE "{source}".op_status SET SCHEMA "{target}"')


def move_function(function: str, source: str, target: str) -> TextClause:
    return text(f'ALTER FUNCTION "{source}".{function}() SET SCHEMA "{target}"')


def pin_function(function: str, schema: str) -> TextClause:
    """The trigger function `function` runs with `schema` as its whole `search_path`."""
    return text(f'ALTER FUNCTION "{schema}".{function}() SET search_path = "{schema}"')
