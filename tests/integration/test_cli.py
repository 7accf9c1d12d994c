"""The `opledger` command against the test Postgres: its exit codes (2 usage, 3 refused,
4 operational), one line on stderr for each failure and the traceback with --debug, --json
documents, tables at 80 columns on a terminal and piped, and a retry resolved while the
broker is down.

Every exit code, the rendering and the broker are checked on the real command, run as a
process: forked from a server that imported the command once (`tests.consoles.cli_forked`:
a second or two of imports each otherwise), side by side; the one on a terminal is started
afresh, so that the command is imported with that terminal as its stdout. The --json
documents, --debug and a few more refusals go through Typer's test runner.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text

from opledger.ledger import Ledger, Status
from opledger.ledger.migrate import sqlalchemy_url
from tests.clirun import (
    BOX,
    BROKER_DOWN,
    WRONG_PORT,
    Run,
    cli_on_terminal,
    fits_80_columns,
    in_review,
    one_line_failure,
    side_by_side,
)
from tests.conftest import SCHEMA, PostgresServer
from tests.consoles import cli_forked


@pytest.fixture
def unmigrated(pg_server: PostgresServer) -> Iterator[str]:
    url = pg_server.create_database("opledger_cli_empty")
    yield url
    pg_server.drop_database(url)


def _tables(url: str) -> int:
    engine = create_engine(sqlalchemy_url(url))
    try:
        with engine.connect() as conn:
            # any table anywhere, and the ledger's schema itself: nothing may be created
            query = (
                "SELECT (SELECT count(*) FROM information_schema.tables WHERE table_schema"
                " NOT IN ('pg_catalog', 'information_schema'))"
                " + (SELECT count(*) FROM pg_namespace WHERE nspname = :schema)"
            )
            return int(conn.execute(text(query), {"schema": SCHEMA}).scalar_one())
    finally:
        engine.dispose()


def test_refused_grant_changes_nothing_and_grants_list_at_80_columns(
    ledger: Ledger, grant: str, database_url: str, invoke: Callable[..., Run]
) -> None:
    ledger.grant(
        tenant="globex",
        scope=[f"crm.some_rather_long_action_name_{i}.v1" for i in range(4)],
        granted_by="alice",
        ref="auth_globex_with_a_long_reference_0123456789",
    )
    before = ledger.authorizations()
    db = database_url

    unknown, listed = cli_forked(
        (db, "grant", "revoke", "auth_nope", "--by", "bob", "--reason", "gone"),
        (db, "grant", "list", "--tenant", "globex"),
    )
    conflict = invoke(
        "grant", "create", "--tenant", "globex", "--scope", "crm.*", "--by", "bob",
        "--ref", grant, OPLEDGER_DEBUG="1",
    )  # fmt: skip
    naive = invoke(
        "grant", "create", "--tenant", "acme", "--scope", "crm.*", "--by", "bob",
        "--ref", "auth_naive", "--expires-at", "2040-01-31",
    )  # fmt: skip

    one_line_failure(unknown, 3, "refused", "no authorization 'auth_nope'")
    # OPLEDGER_DEBUG=1: the traceback instead of the line, the same exit code
    assert conflict.code == 3, conflict.err
    assert "Traceback" in conflict.err and "AuthorizationError" in conflict.err
    assert "already exists with another tenant or scope" in conflict.err
    assert naive.code == 2 and "timezone" in naive.err  # a usage error: Typer's own
    assert ledger.authorizations() == before  # none of them changed anything

    assert listed.code == 0, listed.err
    assert not BOX.search(listed.out)  # piped: plain
    fits_80_columns(listed.out)
    assert "auth_globex_with_a_long_reference_0123456789" in listed.out
    assert "crm.some_rather_long_action_name_3.v1" in listed.out
    assert "auth_acme" not in listed.out

    created = invoke(
        "grant", "create", "--tenant", "acme", "--scope", "crm.*", "--scope", "email.send.v1",
        "--by", "alice", "--ref", "auth_new", "--expires-at", "2040-01-31T18:00:00Z", "--json",
    )  # fmt: skip
    assert created.code == 0, created.err
    new = created.json()
    assert (new["ref"], new["scope"], new["granted_by"], new["active"]) == (
        "auth_new",
        ["crm.*", "email.send.v1"],
        "alice",
        True,
    )
    assert new["expires_at"].startswith("2040-01-31T18:00:00")
    revoked = invoke("grant", "revoke", "auth_new", "--by", "bob", "--reason", "done", "--json")
    assert revoked.json()["revoked_by"] == "bob" and revoked.json()["active"] is False
    shown = invoke("grant", "show", "auth_new", "--json").json()
    assert shown["revoke_reason"] == "done"
    listed_json = invoke("grant", "list", "--tenant", "acme", "--json").json()
    assert [g["ref"] for g in listed_json] == ["auth_new", "auth_acme"]


def test_refusals_exit_3_and_operational_failures_exit_4_in_one_line(
    ledger: Ledger, grant: str, database_url: str, unmigrated: str, invoke: Callable[..., Run]
) -> None:
    op_id = in_review(ledger, "errors", {"note": "x"})

    malformed, wrong_port, empty = cli_forked(
        (database_url, "ops", "show", "op_not-an-id", "--json"),
        (WRONG_PORT, "ops", "list"),
        (unmigrated, "review", "list", "--tenant", "acme", "--json"),
    )
    debugged = invoke(
        "--debug", "review", "list", "--tenant", "acme", OPLEDGER_DATABASE_URL=WRONG_PORT
    )

    one_line_failure(malformed, 3, "refused", "not an operation id", "op_not-an-id")
    one_line_failure(wrong_port, 4, "OPLEDGER_DATABASE_URL", "127.0.0.1:1", "Postgres")
    assert debugged.code == 4 and "Traceback" in debugged.err and "port 1" in debugged.err
    one_line_failure(empty, 4, "opledger migrate")
    assert _tables(unmigrated) == 0  # and it was left as it was

    version = invoke("--version")
    assert version.code == 0 and re.fullmatch(r"opledger \d+\S*\n", version.out), version.out
    (listed,) = invoke("ops", "list", "--json").json()
    assert (listed["id"], listed["status"]) == (op_id, "unknown")
    history = invoke("ops", "show", op_id, "--json").json()
    assert [t["to_status"] for t in history["transitions"]] == [
        "prepared",
        "dispatching",
        "unknown",
    ]
    (review,) = invoke("review", "list", "--tenant", "acme", "--json").json()
    assert review["op_id"] == op_id


def test_review_show_on_a_terminal_and_piped_at_80_columns(
    ledger: Ledger, grant: str, database_url: str, invoke: Callable[..., Run]
) -> None:
    kept = in_review(ledger, "kept", {"note": "closed by the agent", "status": "closed"})
    purged = in_review(ledger, "purged", {"note": "gone"})
    with ledger.engine.begin() as conn:
        conn.execute(text("DELETE FROM operation_payloads WHERE op_id = :id"), {"id": purged})
    show = ("review", "show", "--tenant", "acme", "--operator")

    piped, terminal = side_by_side(
        lambda: cli_forked((database_url, *show, "bob", kept))[0],
        lambda: cli_on_terminal(database_url, *show, "carol", purged),
    )

    assert piped.code == 0, piped.err
    assert not BOX.search(piped.out)
    fits_80_columns(piped.out)
    assert f"review of {kept}" in piped.out and "case-[bold]kept" in piped.out
    assert '"note": "closed by the agent"' in piped.out  # the frozen payload
    assert "consequences" in piped.out

    assert terminal.code == 0, terminal.err
    assert BOX.search(terminal.out)  # a terminal gets the header rules
    fits_80_columns(terminal.out)
    assert purged in terminal.out and "payload: purged" in terminal.out

    view = invoke(*show, "dave", kept, "--json").json()
    assert view["operation"]["id"] == kept and view["payload"]["status"] == "closed"
    assert view["review"]["reason"] == "the response was lost" and view["consequences"]
    assert invoke(*show, "dave", purged, "--json").json()["payload"] is None


def test_a_retry_resolved_while_the_broker_is_down_is_saved_and_said(
    ledger: Ledger, grant: str, database_url: str, invoke: Callable[..., Run]
) -> None:
    op_id = in_review(ledger, "retry", {"note": "again"})
    other = in_review(ledger, "untouched", {"note": "stay"})
    key = ledger.get(op_id).idempotency_key
    assert key.startswith("opk_")
    ledger.reviews.show(op_id, tenant="acme", operator="bob")
    before = ledger.get(other)

    [resolved] = cli_forked(
        (database_url, "review", "resolve", op_id, "--tenant", "acme", "--operator", "bob",
         "--as", "retry", "--new-key", "--note", "asked again"),
        OPLEDGER_BROKER_URL=BROKER_DOWN,
    )  # fmt: skip
    # never shown to erin: refused, and nothing about the operation changes
    unseen = invoke(
        "review", "resolve", other, "--tenant", "acme", "--operator", "erin", "--as", "cancel",
        "--note", "n",
    )  # fmt: skip

    assert resolved.code == 0, resolved.err
    assert (
        "resolved; the retry will be sent when the broker is back (the sweep picks it up)"
        in resolved.out
    )
    assert len(resolved.err_lines) == 1 and "broker" in resolved.err, resolved.err
    op = ledger.get(op_id)
    assert op.status is Status.UNKNOWN and op.operator_retry_by == "bob"
    assert op.idempotency_key == f"{key}.k2" and op.next_check_at is not None  # due now
    (action,) = invoke("review", "audit", op_id, "--tenant", "acme", "--json").json()
    assert (action["operator"], action["resolution"], action["new_key"]) == (
        "bob",
        "retry",
        f"{key}.k2",
    )
    assert action["risk_acknowledged"] is True

    one_line_failure(unseen, 3, "refused", "review show")
    assert ledger.get(other) == before
    assert ledger.reviews.audit(other, tenant="acme") == ()
