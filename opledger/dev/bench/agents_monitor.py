"""What the agents bench sees of its connections: each one of the run names itself
(`application_name`), and a monitor samples the server's client connections per database
and reads each database's transaction count."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url

#: Every connection of the run to the ledger's database carries one of these names but the
#: bench process's waiting ones: the worker's (its database URL names it), the ledger pool's
#: in the bench process (set as each connection is opened) and the drain's poll. The bench
#: process's connections for waiting are then those left (whatever else names them: the
#: listener's own connection, or one per waiting agent).
WORKER_NAME = "opledger-bench-worker"
POOL_NAME = "opledger-bench-pool"
POLL_NAME = "opledger-bench-poll"
MONITOR_NAME = "opledger-bench-monitor"
LABELLED = (WORKER_NAME, POOL_NAME, POLL_NAME, MONITOR_NAME)
#: how often the monitor samples pg_stat_activity
SAMPLE_EVERY = 0.2


def libpq(url: str, **query: str) -> str:
    parsed = make_url(url).set(drivername="postgresql")
    if query:
        parsed = parsed.update_query_dict(query)
    return parsed.render_as_string(hide_password=False)


def named(url: str, name: str) -> str:
    """`url` whose connections name themselves `name` (pg_stat_activity.application_name)."""
    return (
        make_url(url)
        .update_query_dict({"application_name": name})
        .render_as_string(hide_password=False)
    )


def name_connections(engine: Engine, name: str) -> None:
    """Every connection `engine` opens from now on names itself `name` (the URL stays as it
    was: what is derived from it, the settle listener's connection, is not named)."""

    def named_one(_dialect: Any, _record: Any, _args: Any, params: dict[str, Any]) -> None:
        params["application_name"] = name

    event.listen(engine, "do_connect", named_one)
    engine.dispose()  # none opened before is left unnamed


class Monitor:
    """Client connections to the run's databases, sampled every SAMPLE_EVERY seconds from
    a connection to the server's own database (so it counts in neither); the most seen
    since `reset()`. Also reads a database's transaction count."""

    def __init__(self, server_url: str, *datnames: str) -> None:
        self.datnames = list(datnames)
        self.conn = psycopg.connect(
            libpq(server_url), autocommit=True, application_name=MONITOR_NAME
        )
        self._lock = threading.Lock()
        self._peaks: dict[str, int] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(SAMPLE_EVERY):
            self.sample()

    def sample(self) -> None:
        with self._lock:
            rows = self.conn.execute(
                "SELECT datname, application_name, count(*) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND datname = ANY(%s)"
                " GROUP BY datname, application_name",
                [self.datnames],
            ).fetchall()
            counts: dict[str, int] = {}
            for datname, name, n in rows:
                counts[datname] = counts.get(datname, 0) + n
                if name not in LABELLED:
                    counts[f"waiting:{datname}"] = counts.get(f"waiting:{datname}", 0) + n
            for key, n in counts.items():
                self._peaks[key] = max(self._peaks.get(key, 0), n)

    def reset(self) -> None:
        with self._lock:
            self._peaks = {}
        self.sample()

    def peak(self, datname: str) -> int:
        """The most client connections to `datname` seen since `reset()`."""
        self.sample()
        with self._lock:
            return self._peaks.get(datname, 0)

    def peak_waiting(self, datname: str) -> int:
        """The most connections to `datname` seen since `reset()` that none of the run's
        names claims: the bench process's connections for waiting."""
        self.sample()
        with self._lock:
            return self._peaks.get(f"waiting:{datname}", 0)

    def transactions(self, datname: str) -> int:
        """Committed and rolled back transactions of `datname` so far (as reported)."""
        with self._lock:
            self.conn.execute("SELECT pg_stat_clear_snapshot()")
            row = self.conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                [datname],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self.conn.close()
