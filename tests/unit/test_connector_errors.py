"""What the one door to Postgres makes of a server it cannot reach: the ledger's
`DatabaseUnavailable` (which Celery's tasks and the agents retry), on every path."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from opledger.ledger.connector import Connector, ledger_engine, transient, translate
from opledger.ledger.errors import DatabaseUnavailable

#: what a standby being promoted answers before it reached a consistent state
NOT_YET = (
    'connection failed: connection to server at "127.0.0.1", port 5433 failed: FATAL:  '
    "the database system is not yet accepting connections\n"
    "DETAIL:  Consistent recovery state has not been yet reached."
)


@pytest.mark.parametrize(
    "said",
    [
        NOT_YET,
        'connection to server at "127.0.0.1" failed: FATAL:  the database system is starting up',
        'connection to server at "127.0.0.1" failed: FATAL:  '
        "the database system is in recovery mode",
    ],
)
def test_a_server_that_is_not_ready_yet_is_unavailable_for_now(said: str) -> None:
    exc = psycopg.OperationalError(said)
    assert transient(exc)
    assert isinstance(translate(exc), DatabaseUnavailable)


def test_a_refused_login_is_not_transient() -> None:
    exc = psycopg.OperationalError(
        'connection failed: FATAL:  password authentication failed for user "opledger"'
    )
    assert not transient(exc)
    assert translate(exc) is None


def test_the_hot_path_without_a_server_is_unavailable_not_a_driver_error() -> None:
    """The hot path's first connection comes from the engine, whose connect raises
    SQLAlchemy's error: it is translated like every other (a failover once showed a raw
    `sqlalchemy.exc.OperationalError` to an agent instead)."""
    engine = ledger_engine("postgresql://nobody@127.0.0.1:1/none", schema="opledger")
    try:
        with pytest.raises(DatabaseUnavailable, match="unavailable"):
            Connector(engine).hot(text("SELECT CAST(:one AS int)"), {"one": 1})
    finally:
        engine.dispose()
