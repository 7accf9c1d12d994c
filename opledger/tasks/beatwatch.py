"""The workers' watch on beat: one warning when it goes missing, one line when it is back.

Without beat a worker still dispatches what it is sent, but nothing relays a prepared
operation whose message was lost, sweeps an expired lease or hands out a due check: the
fleet looks busy and quietly stops recovering. So each worker (its main process, not its
pool's) reads the beat's heartbeat (`Ledger.beat_seen`, one statement by key) every
`WATCH_EVERY_S` on a thread of its own, and logs a change only: a warning when no beat
ticked within `OPLEDGER_BEAT_MISSING_AFTER_SECONDS` (also at the worker's start), one info
line when a beat ticks again. A heartbeat it cannot read (the database away) is one
warning too, and reading goes on.

`install(app)` adds the watch to a Celery app's worker as a bootstep (`BeatWatchStep`):
opledger's own app does it (`opledger.tasks.app`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from celery import Celery, bootsteps

from opledger.ledger.beats import START_BEAT, BeatSeen
from opledger.settings import get_settings

log = logging.getLogger("opledger.beatwatch")

#: how often a worker reads the beat's heartbeat, at most (half the missing threshold if
#: that is shorter)
WATCH_EVERY_S = 30.0
#: how long one read's connection attempt may take
CONNECT_TIMEOUT_S = 5


class BeatWatch:
    """Reads the beat's heartbeat with `read` and logs when it changes between missing and
    seen (within `missing_after`); nothing while it stays as it was."""

    def __init__(
        self,
        read: Callable[[], BeatSeen],
        *,
        missing_after: timedelta,
        logger: logging.Logger = log,
    ) -> None:
        self._read = read
        self.missing_after = missing_after
        self._log = logger
        #: whether beat was missing at the last read (None: not read yet)
        self.missing: bool | None = None
        self._unreadable = False

    def check(self) -> bool | None:
        """Read the heartbeat once; whether beat is missing (as last known, when it cannot
        be read)."""
        try:
            seen = self._read()
        except Exception as exc:  # the database is away: said once, read again later
            if not self._unreadable:
                self._log.warning(
                    "beat watch: the beat's heartbeat cannot be read (%s: %s); trying again",
                    type(exc).__name__,
                    " ".join(str(exc).split())[:300],
                )
            self._unreadable = True
            return self.missing
        self._unreadable = False
        missing = seen.missing(self.missing_after)
        if missing and self.missing is not True:
            self._log.warning("%s", missing_line(seen, self.missing_after))
        elif not missing and self.missing is True:
            age = seen.age.total_seconds() if seen.age is not None else 0.0
            self._log.info("beat is back: it ticked %.0f s ago (%s)", age, seen.who())
        self.missing = missing
        return missing


def missing_line(seen: BeatSeen, after: timedelta) -> str:
    """What a worker says when beat is missing."""
    if not seen.ever:
        said = "no beat has ever run against this ledger"
    else:
        said = (
            f"no beat: beat {seen.since()}, longer than OPLEDGER_BEAT_MISSING_AFTER_SECONDS "
            f"({after.total_seconds():g} s; last {seen.who()})"
        )
    return (
        f"{said}: nothing relays, sweeps or reconciles (prepared operations whose message "
        f"was lost wait, unknown ones are not checked) until one runs; {START_BEAT}"
    )


def ledger_reader() -> Callable[[], BeatSeen]:
    """`Ledger.beat_seen` on the configured ledger, through an engine that keeps no
    connection between two reads (one every half minute)."""
    from sqlalchemy.pool import NullPool

    from opledger.ledger import Ledger
    from opledger.ledger.connector import ledger_engine

    settings = get_settings()
    engine = ledger_engine(
        settings.require_database_url(),
        schema=settings.database_schema,
        poolclass=NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )
    return Ledger(engine, schema=settings.database_schema).beat_seen


class BeatWatchStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """The worker's bootstep: a daemon thread of the worker's main process runs a
    `BeatWatch` from the worker's start to its stop."""

    label = "opledger beat watch"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="opledger-beat-watch", daemon=True)
        self._thread.start()

    def stop(self, parent: Any) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            after = timedelta(seconds=get_settings().beat_missing_after_seconds)
            watch = BeatWatch(ledger_reader(), missing_after=after)
        except Exception as exc:  # no ledger configured: nothing to watch
            log.warning("beat watch: not started (%s)", exc)
            return
        every = min(WATCH_EVERY_S, after.total_seconds() / 2)
        while True:
            watch.check()
            if self._stop.wait(every):
                return


def install(app: Celery) -> None:
    """Add the beat watch to `app`'s workers (once)."""
    steps = app.steps["worker"]
    if BeatWatchStep not in steps:
        steps.add(BeatWatchStep)


__all__ = ["WATCH_EVERY_S", "BeatWatch", "BeatWatchStep", "install", "missing_line"]
