"""The ledger in a Postgres schema of its own, beside an application's tables.

Nothing of the ledger is created in `public`; an application's transaction that prepares
an operation keeps its own `search_path`, even with tables of the ledger's names of its
own; a change made from a session that does not know the ledger's schema still writes the
ledger's audit trail; and a deployment from before the schema (in `public`) moves into it
with its whole history through `opledger migrate --from-schema public`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from opledger.cli.main import app
from opledger.ledger import Binding, Confirmed, Ledger, Status
from opledger.ledger.connector import sqlalchemy_url
from opledger.ledger.migrate import SchemaConflict, downgrade, move_schema, upgrade
from opledger.ledger.pgschema import DEFAULT_SCHEMA, check_schema
from opledger.settings import Settings, SettingsInvalid, get_settings
from tests.conftest import SCHEMA, PostgresServer

CLOSE: dict[str, Any] = {
    "tenant": "acme",
    "workflow_id": "wf-schema",
    "action": "crm.close_case.v1",
    "target": "case-1",
    "payload": {"status": "closed"},
}


@pytest.fixture
def app_engine(database_url: str) -> Iterator[Engine]:
    """An application's own engine on the ledger's database: default `search_path`."""
    engine = create_engine(sqlalchemy_url(database_url))
    with engine.begin() as conn:
        # the application's own tables, named as the ledger's are
        conn.execute(text("DROP TABLE IF EXISTS public.operations, public.transitions"))
        conn.execute(text("CREATE TABLE public.operations (id int PRIMARY KEY, note text)"))
        conn.execute(text("CREATE TABLE public.transitions (id int)"))
    yield engine
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS public.operations, public.transitions"))
    engine.dispose()


@pytest.fixture
def empty_db(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_schema")
    yield url
    pg_server.drop_database(url)


def test_the_suite_runs_in_a_schema_that_is_not_the_default() -> None:
    assert SCHEMA != DEFAULT_SCHEMA  # what the rest of this file proves depends on it


def test_nothing_of_the_ledger_is_created_in_public(empty_db: str) -> None:
    upgrade(empty_db)
    engine = create_engine(sqlalchemy_url(empty_db))
    try:
        with engine.connect() as conn:
            in_public = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM pg_class"
                    "        WHERE relnamespace = 'public'::regnamespace),"
                    "       (SELECT count(*) FROM pg_proc"
                    "        WHERE pronamespace = 'public'::regnamespace),"
                    "       (SELECT count(*) FROM pg_type"
                    "        WHERE typnamespace = 'public'::regnamespace AND typtype = 'e')"
                )
            ).one()
            in_schema = conn.execute(
                text(
                    "SELECT count(*) FROM pg_tables WHERE schemaname = :s"
                    " AND tablename IN ('operations', 'alembic_version', 'transitions')"
                ),
                {"s": SCHEMA},
            ).scalar_one()
    finally:
        engine.dispose()
    assert tuple(in_public) == (0, 0, 0)
    assert in_schema == 3


def test_an_applications_transaction_keeps_its_own_search_path(
    ledger: Ledger, grant: str, app_engine: Engine
) -> None:
    with Session(app_engine) as session:
        before = session.execute(text("SELECT current_setting('search_path')")).scalar_one()
        session.execute(text("INSERT INTO operations (id, note) VALUES (1, 'the app''s own')"))
        op = ledger.prepare(**CLOSE, intent_key="outbox", authorization_ref=grant, session=session)
        after = session.execute(text("SELECT current_setting('search_path')")).scalar_one()
        # unqualified names are the application's again: its own `operations` table
        session.execute(text("INSERT INTO operations (id, note) VALUES (2, 'after prepare')"))
        session.commit()
    assert after == before
    assert ledger.get(op.id).status is Status.PREPARED
    with app_engine.connect() as conn:
        notes = conn.execute(text("SELECT note FROM public.operations ORDER BY id")).scalars()
        assert list(notes) == ["the app's own", "after prepare"]
        assert conn.execute(text("SELECT count(*) FROM public.transitions")).scalar_one() == 0


def test_a_failed_prepare_leaves_the_applications_search_path_as_it_was(
    ledger: Ledger, grant: str, app_engine: Engine
) -> None:
    from opledger.ledger import IntentConflict

    ledger.prepare(**CLOSE, intent_key="taken", authorization_ref=grant)
    with Session(app_engine) as session:
        before = session.execute(text("SELECT current_setting('search_path')")).scalar_one()
        with pytest.raises(IntentConflict):
            ledger.prepare(
                **{**CLOSE, "payload": {"status": "open"}},
                intent_key="taken",
                authorization_ref=grant,
                session=session,
            )
        after = session.execute(text("SELECT current_setting('search_path')")).scalar_one()
        session.rollback()
    assert after == before


def test_a_change_from_any_session_writes_the_ledgers_own_trail(
    ledger: Ledger, grant: str, app_engine: Engine
) -> None:
    """A person in psql, with the default search_path and a `transitions` table of the
    application's: the trigger functions pin the ledger's schema."""
    op = ledger.prepare(**CLOSE, intent_key="by-hand", authorization_ref=grant)
    with app_engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE \"{SCHEMA}\".operations SET status = 'cancelled', fence = fence + 1,"
                " changed_by = 'dba', change_reason = 'cancelled by hand' WHERE id = :id"
            ),
            {"id": op.id},
        )
    trail = [(t.to_status, t.actor) for t in ledger.history(op.id).transitions]
    assert [status for status, _ in trail] == [Status.PREPARED, Status.CANCELLED]
    assert trail[-1][1] == "dba"
    with app_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM public.transitions")).scalar_one() == 0


def _history_in_public(url: str) -> tuple[str, int]:
    """A deployment from before the schema: the ledger in `public` at revision 0011, with
    an operation confirmed (its attempts, evidence and transitions). Its history is made by
    today's code, then the schema is stepped back to 0011 under it (the rows stay)."""
    upgrade(url, schema="public")
    old = Ledger.from_url(url, schema="public")
    try:
        ref = old.grant(tenant="acme", scope=["crm.*"], granted_by="test").ref
        op = old.prepare(**CLOSE, intent_key="moved", authorization_ref=ref)
        claim = old.claim(op.id, owner="old-worker")
        assert claim is not None
        receipt = Binding(idempotency_key=claim.idempotency_key, target="case-1")
        old.record_outcome(claim, Confirmed(receipt_id="case-1@v2", binding=receipt))
        made = op.id, len(old.history(op.id).transitions)
    finally:
        old.engine.dispose()
    downgrade(url, "0011", schema="public")
    return made


def test_a_deployment_in_public_moves_into_the_schema_with_its_history(
    empty_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    op_id, transitions = _history_in_public(empty_db)
    # a plain migrate would start a second, empty ledger beside it: refused
    with pytest.raises(SchemaConflict, match="--from-schema public"):
        upgrade(empty_db)
    monkeypatch.setenv("OPLEDGER_DATABASE_URL", empty_db)
    get_settings.cache_clear()
    try:
        refused = CliRunner().invoke(app, ["migrate"])
        moved = CliRunner().invoke(app, ["migrate", "--from-schema", "public"])
    finally:
        get_settings.cache_clear()
    assert refused.exit_code == 3 and "--from-schema public" in refused.output
    assert moved.exit_code == 0, moved.output
    assert f'from schema "public" (at 0011) to "{SCHEMA}"' in moved.output
    new = Ledger.from_url(empty_db)
    try:
        history = new.history(op_id)
        assert history.operation.status is Status.CONFIRMED
        assert len(history.transitions) == transitions and history.attempts and history.evidence
        # its triggers work in the new schema: a new operation is audited there
        ref = history.operation.authorization_ref
        fresh = new.prepare(**CLOSE, intent_key="after-move", authorization_ref=ref)
        assert [t.to_status for t in new.history(fresh.id).transitions] == [Status.PREPARED]
        with new.engine.connect() as conn:
            left = conn.execute(
                text("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace")
            ).scalar_one()
            pinned = conn.execute(
                text(
                    "SELECT DISTINCT unnest(proconfig) FROM pg_proc"
                    " WHERE pronamespace = CAST(:s AS regnamespace)"
                ),
                {"s": SCHEMA},
            ).scalars()
            assert left == 0
            assert list(pinned) == [f"search_path={SCHEMA}"]
    finally:
        new.engine.dispose()
    # moved once: there is nothing left to move
    with pytest.raises(SchemaConflict, match="holds no ledger"):
        move_schema(empty_db, source="public")


def test_a_bad_schema_name_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("Acme", "acme-ledger", "pg_ledger", "1acme", "a" * 64, 'x"; DROP'):
        with pytest.raises(SettingsInvalid) as caught:
            Settings.from_environ({"OPLEDGER_DATABASE_SCHEMA": bad})
        said = str(caught.value)
        assert "OPLEDGER_DATABASE_SCHEMA" in said and "\n" not in said, said
    monkeypatch.delenv("OPLEDGER_DATABASE_SCHEMA")
    assert Settings.from_environ({}).database_schema == DEFAULT_SCHEMA
    assert check_schema("acme_ledger_2") == "acme_ledger_2"
