"""Beat, in one place: its scheduler and the one-beat lock.

- `Scheduler`: Celery's persistent scheduler, whose first broker connection waits out a
  broker that refuses it (below);
- `BeatLock`: exactly one beat per ledger, a Postgres advisory lock held for the beat's
  whole life (`opledger beat` takes it before it starts).

What beat sends (the sweep, the relay and the payload purge) is data, in `tasks.wiring`
(`BEAT_ENTRIES`), with the name Celery's `beat_scheduler` gives this scheduler
(`SCHEDULER`): `celeryconfig` and `register(app)` read them there.

The scheduler. Celery's beat opens its producer's connection at its first tick and retries
it only on the transport's *recoverable* errors (a refused socket, a forced close), up to
`broker_connection_max_retries`. A broker that answers but refuses the connection is
"irrecoverable" to kombu, and one such refusal there ends the beat process:

- RabbitMQ answers `NOT_ALLOWED - vhost ... is down` while it recovers a virtual host
  after a restart, and `NOT_ALLOWED - vhost ... not found` or `ACCESS_REFUSED` while one
  is re-created and its permissions restored;
- after a long outage, `broker_connection_max_retries` ends the recoverable retries too.

A beat started (or restarted by its supervisor) while the broker recovers meets this: its
startup checks passed a moment before its first tick. A beat that has exited runs no sweep
and no relay: unknown operations are never checked again and the prepared operations whose
message the broker lost are never published again, until someone restarts it. So this
scheduler logs the refusal and tries again, with a capped backoff, for as long as it
takes. A beat being stopped (SIGTERM, SIGINT) still stops at once: beat's signal handler
raises `SystemExit`, which nothing here catches.

Once connected, a running beat already rides refusals out: a publish that fails is logged
by `apply_entry` and the entry runs again at its next interval, on a connection kombu
re-opens (declaring the queues on it again, so nothing goes to a missing exchange).

Its schedule file (when each entry last ran) goes to the state directory
(`OPLEDGER_STATE_DIR`, else `.opledger`: `state_dir()/celerybeat-schedule`), not Celery's
default of the working directory, unless the app chose `beat_schedule_filename` or beat was
given `--schedule`/`-s` with another path: for `opledger beat`, `celery -A
opledger.tasks.app beat` and an app of your own with `register(app)` alike.

The heartbeat. Without beat nothing relays, sweeps or reconciles, and a beat whose process
lives but whose scheduler is stuck is no better. So the scheduler's own loop (`tick`) writes
the beat's heartbeat into the ledger (`Heartbeat`: host, pid, since when, and the
database's time of this tick), at most every `HEARTBEAT_EVERY_S` (a quarter of
`OPLEDGER_BEAT_MISSING_AFTER_SECONDS` when that is shorter), waking for it when no entry is
due sooner. `opledger check`, the workers, the metrics and the agents' answers read it
(`opledger.ledger.beats`). A heartbeat that cannot be written is logged once, and once
again when it can; the schedule runs on regardless.

The lock lives on one connection. If Postgres restarts, that connection (and the lock) is
gone, so a guard thread checks it and takes the lock again; if another beat got there
first, this one exits at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from celery.beat import PersistentScheduler
from kombu.exceptions import OperationalError

from opledger.ledger.connector import dedicated, ledger_engine, run
from opledger.ledger.facades import BeatLedger
from opledger.ledger.pgschema import beat_lock_key
from opledger.ledger.queries.dedicated import IN_RECOVERY, TRY_BEAT_LOCK
from opledger.settings import get_settings, state_dir

log = logging.getLogger("opledger.beat")

#: seconds between two connection attempts after a refusal: doubling up to the cap
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 30.0

#: the schedule file Celery's beat is given when neither the app nor `-s` names one:
#: relative, so in whatever directory beat was started from
CELERY_SCHEDULE_FILE = "celerybeat-schedule"

#: how often the scheduler's loop writes the beat's heartbeat, at most
HEARTBEAT_EVERY_S = 5.0
#: how long the heartbeat's connection attempt may take (the schedule waits for it)
HEARTBEAT_CONNECT_TIMEOUT_S = 5


def schedule_file() -> Path:
    """Where opledger's beat keeps its schedule unless told otherwise."""
    return state_dir() / CELERY_SCHEDULE_FILE


class Scheduler(PersistentScheduler):  # type: ignore[misc]
    """`PersistentScheduler` whose broker connection outlives the broker's refusals, and
    whose schedule file is in the state directory unless one was chosen."""

    #: time.sleep, replaceable in tests
    sleep = staticmethod(time.sleep)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        app = kwargs.get("app", args[0] if args else None)
        if kwargs.get("schedule_filename") == CELERY_SCHEDULE_FILE and not _chosen_file(app):
            kwargs["schedule_filename"] = str(_in_state_dir())
        super().__init__(*args, **kwargs)

    def adjust(self, n: Any, drift: float = -0.010) -> Any:
        """When an entry is next due, without Celery's early wake-up.

        Celery's scheduler puts each entry in its heap `drift` (10 ms) before it is due;
        woken there, the entry says it is not due yet, is put back, and beat ticks again at
        once: a busy loop for the last 10 ms before every run, about 40 ms of CPU a second
        with two entries every half second. Waking when the entry is due runs it on time
        without the loop."""
        return n

    def _ensure_connected(self) -> Any:
        conn = self.connection
        refused = (OperationalError, *conn.connection_errors, *conn.channel_errors)
        wait = FIRST_WAIT_S
        while True:
            try:
                return super()._ensure_connected()
            except refused as exc:
                log.error(
                    "beat: the broker refused the connection (%s: %s); trying again in %.0f s",
                    type(exc).__name__,
                    exc,
                    wait,
                )
                self._forget_connection()
                self.sleep(wait)
                wait = min(wait * 2, MAX_WAIT_S)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of beat's loop (Celery's), then the heartbeat (`Heartbeat.beat`: at most
        every `heartbeat.every` seconds); sleeps no longer than that before the next pass."""
        interval = float(super().tick(*args, **kwargs))
        heartbeat = self.__dict__.get("heartbeat")
        if heartbeat is None:
            heartbeat = self.__dict__["heartbeat"] = Heartbeat()
        heartbeat.beat()
        return min(interval, heartbeat.every)

    def _forget_connection(self) -> None:
        """Drop the half-open connection, so the next attempt starts from a clean one."""
        conn = self.__dict__.pop("connection", None)
        if conn is not None:
            try:
                conn.collect()
            except Exception:  # it is being thrown away
                log.debug("beat: closing a refused connection failed", exc_info=True)


def _chosen_file(app: Any) -> bool:
    """Whether the app chose its schedule file (`beat_schedule_filename`, in any way)."""
    from .integrate import chosen

    return app is not None and chosen(app, "beat_schedule_filename")


def _in_state_dir() -> Path:
    """The schedule file in the state directory, which is created if missing; the
    working directory's (Celery's default) if it cannot be, said in one line."""
    path = schedule_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.error(
            "beat: cannot create the state directory %s (%s): the schedule goes to %s in the "
            "working directory (set OPLEDGER_STATE_DIR, or pass --schedule PATH)",
            path.parent,
            exc.strerror or exc,
            CELERY_SCHEDULE_FILE,
        )
        return Path(CELERY_SCHEDULE_FILE)
    return path.resolve()


class Heartbeat:
    """The running beat's heartbeat, written into the ledger at most every `every` seconds.

    Its ledger is opened on the first beat (never when a scheduler is only built), on a
    pool of one connection whose attempts give up after a few seconds."""

    def __init__(
        self,
        ledger: BeatLedger | None = None,
        *,
        every: float | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self._ledger = ledger
        if every is None:
            missing_after = get_settings().beat_missing_after_seconds
            every = min(HEARTBEAT_EVERY_S, missing_after / 4)
        self.every = every
        self._clock = clock
        self.host = socket.gethostname()
        self.started_at = datetime.now(UTC)
        self._last: float | None = None
        self._failing = False

    def beat(self) -> bool:
        """Write the heartbeat if `every` seconds passed since the last; whether it was
        written. A failure is logged once (and its end once), never raised."""
        now = self._clock()
        if self._last is not None and now - self._last < self.every:
            return False
        self._last = now
        try:
            self.ledger().beat_heartbeat(
                host=self.host, pid=os.getpid(), started_at=self.started_at
            )
        except Exception as exc:  # the database is away, or refuses: the schedule goes on
            if not self._failing:
                log.warning(
                    "beat: cannot write its heartbeat into the ledger (%s: %s): `opledger "
                    "check` and the workers will say no beat runs; trying again every %.0f s",
                    type(exc).__name__,
                    " ".join(str(exc).split())[:300],
                    self.every,
                )
            self._failing = True
            return False
        if self._failing:
            log.info("beat: its heartbeat is written into the ledger again")
        self._failing = False
        return True

    def ledger(self) -> BeatLedger:
        if self._ledger is None:
            from opledger.ledger import Ledger

            settings = get_settings()
            engine = ledger_engine(
                settings.require_database_url(),
                schema=settings.database_schema,
                pool_size=1,
                max_overflow=0,
                pool_recycle=1800,
                connect_args={"connect_timeout": HEARTBEAT_CONNECT_TIMEOUT_S},
            )
            self._ledger = Ledger(engine, schema=settings.database_schema)
        return self._ledger


# -- exactly one beat ------------------------------------------------------------------


log = logging.getLogger("opledger.beat")


class BeatLockTaken(RuntimeError):
    """Another beat holds the lock."""


class BeatLock:
    def __init__(self, url: str, *, schema: str, check_every: float = 2.0) -> None:
        self._key = beat_lock_key(schema)  # one beat per ledger, whatever else the database holds
        self._url = url  # every host of it, tried in order by each connection
        self._check_every = check_every
        self._stop = threading.Event()
        self._conn = self._take()
        self._thread = threading.Thread(target=self._guard, name="beat-lock", daemon=True)
        self._thread.start()

    def _take(self) -> psycopg.Connection:
        conn = dedicated(self._url, timeout=5)
        if _standby(conn):
            # advisory locks work on a standby too: a lock taken there would not exclude a
            # beat on the primary (a URL without target_session_attrs=read-write)
            conn.close()
            raise psycopg.OperationalError("the beat's lock connection reached a standby")
        row = run(conn, TRY_BEAT_LOCK, {"key": self._key}).fetchone()
        if not row or not row[0]:
            conn.close()
            raise BeatLockTaken("another opledger beat is running against this ledger")
        return conn

    def _guard(self) -> None:
        while not self._stop.wait(self._check_every):
            try:
                if not _standby(self._conn):
                    continue
                log.warning("the beat's lock is held on a standby now: taking it again")
                self._conn.close()
            except psycopg.Error:
                log.warning("the beat's lock connection is gone: taking the lock again")
            try:
                self._conn = self._take()
            except BeatLockTaken:
                log.error("another beat took the lock while the database was away: exiting")
                os._exit(1)
            except psycopg.Error:
                time.sleep(self._check_every)  # the database is still away; sweeps wait too

    def release(self) -> None:
        self._stop.set()
        # the guard may be taking the lock again on a new connection this very moment: wait
        # for it, so the connection closed here is the one that holds the lock (closing the
        # old one alone left the new one holding it until it was collected)
        self._thread.join(timeout=self._check_every + 10)
        self._conn.close()


def _standby(conn: psycopg.Connection) -> bool:
    """Whether `conn`'s server is a standby (in recovery): a promotion made it a primary no
    longer, or a multi-host URL without target_session_attrs=read-write landed there."""
    row = run(conn, IN_RECOVERY).fetchone()
    return bool(row and row[0])


__all__ = ["BeatLock", "BeatLockTaken", "Heartbeat", "Scheduler", "schedule_file"]
