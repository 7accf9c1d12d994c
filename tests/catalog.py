"""What a ledger's schema defines, part by part, read from the catalog: to compare
the schema file with the migrations, and one migration path with another."""

from __future__ import annotations

from tests.conftest import connect_ledger

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


def catalog(url: str) -> dict[str, list[tuple[str, ...]]]:
    """What the ledger's schema at `url` defines (`CATALOG`), part by part."""
    with connect_ledger(url) as conn:
        return {
            name: [tuple(map(str, row)) for row in conn.execute(sql)]
            for name, sql in CATALOG.items()
        }
