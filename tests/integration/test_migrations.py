"""Migrations: upgrade on an empty database builds the ledger's tables (the ones
`migrate.ledger_tables()` reads from schema.sql); down and up again build the same."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import inspect

from opledger.ledger.connector import ledger_engine
from opledger.ledger.migrate import downgrade, ledger_tables, upgrade
from tests.catalog import catalog
from tests.conftest import SCHEMA, PostgresServer, connect_ledger
from tests.consoles import opledger_here


@pytest.fixture
def empty_db(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_migr")
    yield url
    pg_server.drop_database(url)


def _tables(url: str, schema: str = SCHEMA) -> set[str]:
    engine = ledger_engine(url, schema=SCHEMA)
    try:
        return set(inspect(engine).get_table_names(schema=schema))
    finally:
        engine.dispose()


def test_the_ledgers_tables_are_the_ones_schema_sql_creates(empty_db: str) -> None:
    upgrade(empty_db)
    assert _tables(empty_db) == {*ledger_tables(), "alembic_version"}
    assert len(set(ledger_tables())) == len(ledger_tables())


def test_upgrade_head_then_down_and_up_again_builds_the_same(empty_db: str) -> None:
    upgrade(empty_db)
    built = catalog(empty_db)
    assert {"operations", "operation_payloads", "attempts", "evidence"} <= _tables(empty_db)
    downgrade(empty_db, "base")
    assert _tables(empty_db) <= {"alembic_version"}
    with connect_ledger(empty_db) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_type WHERE typname = 'op_status'"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = 'opledger_guard_operation'"
        ).fetchone() == (0,)
    upgrade(empty_db)
    assert catalog(empty_db) == built


def test_the_cli_migrates_the_configured_database_and_says_what_it_did(empty_db: str) -> None:
    """An empty database: the ledger is created, and the line says so with its revision;
    again: nothing to do; a ledger at an older revision: upgraded from it to head."""
    env = {"OPLEDGER_DATABASE_URL": empty_db, "OPLEDGER_DATABASE_SCHEMA": SCHEMA}
    created = opledger_here(env, "migrate")
    assert created.returncode == 0, created.stdout + created.stderr
    head = _revision(empty_db)
    assert created.stdout.strip() == f'created the ledger in schema "{SCHEMA}" at revision {head}'
    assert _tables(empty_db) == {*ledger_tables(), "alembic_version"}

    again = opledger_here(env, "migrate")
    assert again.stdout.strip() == (
        f'ledger schema "{SCHEMA}" is at head (revision {head}): no change'
    ), again.stdout + again.stderr

    downgrade(empty_db, "0015")
    upgraded = opledger_here(env, "migrate")
    assert upgraded.stdout.strip() == (
        f'upgraded ledger schema "{SCHEMA}" from revision 0015 to {head}'
    ), upgraded.stdout + upgraded.stderr
    assert _revision(empty_db) == head


def _revision(url: str) -> str:
    with connect_ledger(url) as conn:
        row = conn.execute(f'SELECT version_num FROM "{SCHEMA}".alembic_version').fetchone()
    assert row is not None
    return str(row[0])


AUDITED_CHANGE = """
INSERT INTO authorizations (ref, tenant, scope, granted_by) VALUES ('auth_m', 'm', '{m.*}', 'ops');
INSERT INTO operations (id, tenant, workflow_id, intent_key, action, target, provider,
                        payload_digest, payload_size, authorization_ref, idempotency_key,
                        changed_by, change_reason)
VALUES ('op_01JAAAAAAAAAAAAAAAAAAAAAAA', 'm', 'wf', 'k', 'm.x.v1', 't', 'm', repeat('a', 64), 2,
        'auth_m', 'key', 'test', 'prepared');
UPDATE operations SET status = 'cancelled', fence = 1, changed_by = 'ops', change_reason = 'why'
WHERE id = 'op_01JAAAAAAAAAAAAAAAAAAAAAAA';
"""


def _trail(url: str) -> list[tuple[object, ...]]:
    with connect_ledger(url) as conn:
        return conn.execute(
            "SELECT from_status::text, to_status::text, fence, actor, reason FROM transitions"
            " ORDER BY id"
        ).fetchall()


@pytest.mark.parametrize("revision", ["0006", "head"])
def test_every_revision_with_audit_triggers_writes_the_same_trail(
    empty_db: str, revision: str
) -> None:
    """0007 merged the audit into the guard: at 0006 (and after going down to it) and at
    head, a change writes the same rows, and a change that does not say who is refused."""
    upgrade(empty_db)
    if revision != "head":
        downgrade(empty_db, revision)
    with connect_ledger(empty_db) as conn:
        conn.execute(AUDITED_CHANGE)
        conn.commit()
        with pytest.raises(psycopg.DatabaseError, match="does not say who"):
            conn.execute(
                "UPDATE operations SET fence = 2 WHERE id = 'op_01JAAAAAAAAAAAAAAAAAAAAAAA'"
            )
        conn.rollback()
        # an update of neither status nor fence passes untouched and writes no row
        conn.execute("UPDATE operations SET enqueued_at = now()")
        conn.commit()
    assert _trail(empty_db) == [
        (None, "prepared", 0, "test", "prepared"),
        ("prepared", "cancelled", 1, "ops", "why"),
    ]
