"""opledger/ledger/schema.sql, the schema to read in one place, defines exactly what the
migrations build: the same tables, columns, constraints, indexes, functions and triggers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opledger.ledger.migrate import upgrade
from tests.conftest import SCHEMA, PostgresServer, connect_ledger

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "opledger" / "ledger" / "schema.sql"

#: what a database defines, as the catalog states it (whatever the text's formatting)
CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, udt_name, is_nullable, column_default,
               is_identity, identity_generation
        FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name <> 'alembic_version'
        ORDER BY 1, 2""",
    "constraints": """
        SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)
        FROM pg_constraint
        WHERE connamespace = current_schema()::regnamespace
          AND conrelid::regclass::text <> 'alembic_version'
        ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename <> 'alembic_version'
        ORDER BY 1, 2""",
    "functions": """
        SELECT proname, pg_get_functiondef(oid) FROM pg_proc
        WHERE pronamespace = current_schema()::regnamespace ORDER BY 1""",
    "triggers": """
        SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid) FROM pg_trigger
        WHERE NOT tgisinternal ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, array_agg(e.enumlabel ORDER BY e.enumsortorder)
        FROM pg_type AS t JOIN pg_enum AS e ON e.enumtypid = t.oid
        WHERE t.typnamespace = current_schema()::regnamespace GROUP BY 1 ORDER BY 1""",
}


@pytest.fixture
def two_databases(pg_server: PostgresServer) -> Iterator[tuple[str, str]]:
    migrated = pg_server.create_database("opledger_migrated")
    loaded = pg_server.create_database("opledger_schema_sql")
    try:
        yield migrated, loaded
    finally:
        pg_server.drop_database(migrated)
        pg_server.drop_database(loaded)


def catalog(url: str) -> dict[str, list[tuple[str, ...]]]:
    """What the ledger's schema at `url` defines (`CATALOG`), part by part."""
    with connect_ledger(url) as conn:
        return {
            name: [tuple(map(str, row)) for row in conn.execute(sql)]
            for name, sql in CATALOG.items()
        }


def test_the_schema_file_defines_what_the_migrations_build(
    two_databases: tuple[str, str],
) -> None:
    migrated, loaded = two_databases
    upgrade(migrated)
    with connect_ledger(loaded, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{SCHEMA}"')  # the file is read in the ledger's schema
        conn.execute(SCHEMA_SQL.read_text())
    built, written = catalog(migrated), catalog(loaded)
    assert built["columns"], "the migrated database has no tables"
    for part in CATALOG:
        missing = sorted(set(built[part]) - set(written[part]), key=str)
        extra = sorted(set(written[part]) - set(built[part]), key=str)
        assert not missing and not extra, (
            f"schema.sql and the migrations differ in {part}:\n"
            f"  only the migrations: {missing}\n  only schema.sql: {extra}"
        )
