"""The hot statements as psycopg receives them: shorter than the size up to which psycopg
caches its parse of a statement (else it parses the statement on every execution), and
still the same statement (every string literal and every placeholder kept)."""

from __future__ import annotations

import re

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH
from sqlalchemy import TextClause

from opledger.ledger import queries as q
from opledger.ledger.connector import _DIALECT, compact, psycopg_sql

STATEMENTS = {name: value for name, value in vars(q).items() if isinstance(value, TextClause)}
HOT = ("CLAIM", "RECORD_OUTCOME", "INSERT_GRANTED_OPERATION", "SELECT_ANSWERS", "RELEASE_SLOT")


@pytest.mark.parametrize("name", HOT)
def test_a_hot_statement_is_short_enough_for_psycopg_to_cache(name: str) -> None:
    assert len(psycopg_sql(STATEMENTS[name]).encode()) <= MAX_CACHED_STATEMENT_LENGTH


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_compacting_keeps_every_literal_and_placeholder(name: str) -> None:
    full = str(STATEMENTS[name].compile(dialect=_DIALECT))
    short = compact(full)
    code = "\n".join(line for line in full.splitlines() if not line.strip().startswith("--"))
    assert re.findall(r"'[^']*'", short) == re.findall(r"'[^']*'", code)
    assert re.findall(r"%\(\w+\)s", short) == re.findall(r"%\(\w+\)s", code)
    assert short.split() == code.split()  # the same words in the same order


def test_the_claim_written_out_would_not_be_cached() -> None:
    """Why compacting matters: the claim with its comments is over the limit."""
    full = str(STATEMENTS["CLAIM"].compile(dialect=_DIALECT))
    assert len(full.encode()) > MAX_CACHED_STATEMENT_LENGTH
