"""The hot path's connections on a real Postgres: many threads of one process (agents
sending inline) share as many connections as the engine's pool allows, reused, never one
opened and closed per statement."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from opledger.ledger import DatabaseUnavailable, Ledger

BACKEND = text("SELECT pg_backend_pid()")


def test_many_threads_share_the_pools_worth_of_connections(database_url: str) -> None:
    ledger = Ledger.from_url(database_url, pool_size=2)  # at most 2 + 2 at once, 2 kept
    store = ledger._store
    seen: set[int] = set()
    lock = threading.Lock()
    start = threading.Barrier(16)

    def agent() -> None:
        start.wait()
        for _ in range(25):
            row = store.hot(BACKEND, {})
            assert row is not None
            with lock:
                seen.add(row[0])

    try:
        threads = [threading.Thread(target=agent) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # 400 statements from 16 threads: a handful of sessions, each used again and again
        assert 1 <= len(seen) <= 4, seen
        assert len(store._hot._idle) <= 2
    finally:
        ledger.engine.dispose()


def test_a_thread_waits_for_a_connection_then_is_told_why_not(database_url: str) -> None:
    ledger = Ledger.from_url(database_url, pool_size=1)
    hot = ledger._store._hot
    hot.timeout = 0.2
    assert hot.limit == 2  # its pool's size and overflow: 1 + 1
    held = [hot.take() for _ in range(hot.limit)]
    try:
        with pytest.raises(DatabaseUnavailable, match="pool allows"):
            ledger._store.hot(BACKEND, {})
        hot.give(held.pop())  # one comes back: the next statement gets it
        assert ledger._store.hot(BACKEND, {}) is not None
    finally:
        for one in held:
            hot.give(one)
        ledger.engine.dispose()


def test_a_pool_without_a_bound_puts_none_on_the_hot_path(database_url: str) -> None:
    from sqlalchemy.pool import NullPool

    from opledger.ledger.connector import ledger_engine

    schema = Ledger.from_url(database_url).schema
    engines = [
        ledger_engine(database_url, schema=schema, pool_size=1, max_overflow=-1),  # unlimited
        ledger_engine(database_url, schema=schema, poolclass=NullPool),  # as behind a pooler
    ]
    try:
        for engine in engines:
            hot = Ledger(engine)._store._hot
            assert hot.limit is None
            held = [hot.take() for _ in range(6)]  # more than any default bound
            for one in held:
                hot.give(one)
    finally:
        for engine in engines:
            engine.dispose()
