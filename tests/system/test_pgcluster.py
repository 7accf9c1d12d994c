"""The failover helper (tests/pgcluster.py) on real servers: what a client sees when the
primary's host dies and a standby is promoted, and when a server is restored from a base
backup.

Asynchronous replication loses what the standby had not received when the primary died;
synchronous replication loses nothing a client saw committed; a restore loses everything
after the backup, on the same timeline, with the WAL position going back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.pgcluster import Cluster, Server, cluster_or_skip, multi_host_url

pytestmark = [pytest.mark.system, pytest.mark.own_processes]


@pytest.fixture
def async_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_or_skip(tmp_path, synchronous=False) as cluster:
        yield cluster


@pytest.fixture
def sync_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster_or_skip(tmp_path, synchronous=True) as cluster:
        yield cluster


def ids(server: Server) -> list[int]:
    with server.connect() as conn:
        return [row[0] for row in conn.execute("SELECT id FROM events ORDER BY id")]


def insert_one_by_one(server: Server, first: int, last: int, note: str) -> None:
    """Rows first..last, each committed by its own statement (autocommit)."""
    with server.connect() as conn:
        for i in range(first, last + 1):
            conn.execute("INSERT INTO events VALUES (%s, %s)", [i, note])


def connect_writable(servers: list[Server]) -> psycopg.Connection[Any]:
    return psycopg.connect(multi_host_url(servers), autocommit=True, connect_timeout=5)


def fill_and_replicate(cluster: Cluster, standby: Server) -> None:
    """The table, rows 1..100 on the primary, and the standby caught up with them."""
    with cluster.primary.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO events SELECT g, 'before' FROM generate_series(1, 100) g")
    standby.wait_replayed(cluster.primary.lsn())
    assert ids(standby) == list(range(1, 101))


def test_async_failover_loses_what_the_standby_had_not_received(async_cluster: Cluster) -> None:
    primary = async_cluster.primary
    standby = async_cluster.add_standby("standby1")
    fill_and_replicate(async_cluster, standby)
    # the multi-host URL skips the read-only standby for the primary
    with connect_writable([standby, primary]) as conn:
        assert conn.info.port == primary.port

    standby.pause_replication()
    insert_one_by_one(primary, 101, 150, "while paused")  # each one committed on the primary
    assert ids(primary) == list(range(1, 151))
    assert standby.lsn() < primary.lsn()
    assert primary.timeline() == 1
    assert standby.timeline() == 1

    primary.stop_hard()
    standby.promote()

    assert standby.timeline() == 2
    # the primary, listed first, is down: the client reaches the promoted standby
    with connect_writable([primary, standby]) as conn:
        assert conn.info.port == standby.port
        rows = conn.execute("SELECT id FROM events ORDER BY id").fetchall()
        assert [row[0] for row in rows] == list(range(1, 101))  # 101..150 are gone
        conn.execute("INSERT INTO events VALUES (101, 'after the failover')")
    assert ids(standby) == list(range(1, 102))


def test_sync_failover_keeps_every_commit(sync_cluster: Cluster) -> None:
    primary = sync_cluster.primary
    standby = sync_cluster.add_standby("standby1")
    fill_and_replicate(sync_cluster, standby)

    insert_one_by_one(primary, 101, 150, "synchronous")
    primary.stop_hard()  # at once: the standby's replay may still be behind its flushed WAL
    standby.promote()

    assert standby.timeline() == 2
    with connect_writable([primary, standby]) as conn:
        assert conn.info.port == standby.port
        rows = conn.execute("SELECT id FROM events ORDER BY id").fetchall()
        assert [row[0] for row in rows] == list(range(1, 151))  # every commit survived
        # alone now, its commits wait for no standby
        conn.execute("INSERT INTO events VALUES (151, 'after the failover')")
    assert ids(standby) == list(range(1, 152))


def test_restore_from_a_base_backup_loses_what_came_after(async_cluster: Cluster) -> None:
    primary = async_cluster.primary
    with primary.connect() as conn:
        conn.execute("CREATE TABLE events (id int PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO events SELECT g, 'before' FROM generate_series(1, 100) g")
    backup = primary.base_backup("before")
    with primary.connect() as conn:
        conn.execute("INSERT INTO events SELECT g, 'after' FROM generate_series(101, 1100) g")
    lsn_before = primary.lsn()
    assert ids(primary) == list(range(1, 1101))

    primary.restore_from(backup)

    assert ids(primary) == list(range(1, 101))
    assert primary.timeline() == 1
    assert primary.lsn() < lsn_before
    insert_one_by_one(primary, 101, 101, "after the restore")
    assert ids(primary) == list(range(1, 102))
