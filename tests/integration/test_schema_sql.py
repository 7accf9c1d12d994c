"""opledger/ledger/schema.sql, the schema to read in one place, defines exactly what the
migrations build: the same tables, columns, constraints, indexes, functions and triggers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from opledger.ledger.migrate import upgrade
from tests.catalog import CATALOG, catalog
from tests.conftest import SCHEMA, PostgresServer, connect_ledger

SCHEMA_SQL = Path(__file__).resolve().parents[2] / "opledger" / "ledger" / "schema.sql"

#: what a database defines, as the catalog states it (whatever the text's formatting)


@pytest.fixture
def two_databases(pg_server: PostgresServer) -> Iterator[tuple[str, str]]:
    migrated = pg_server.create_database("opledger_migrated")
    loaded = pg_server.create_database("opledger_schema_sql")
    try:
        yield migrated, loaded
    finally:
        pg_server.drop_database(migrated)
        pg_server.drop_database(loaded)


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
