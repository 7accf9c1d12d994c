"""Beat liveness: the running beat's heartbeat, written and read.

Without beat nothing relays, sweeps or reconciles: a prepared operation whose message was
lost is never published again, an unknown one never checked again. So the beat writes a
heartbeat from its scheduler's loop (`opledger.tasks.beat.Scheduler`: every few seconds,
proof that it ticks, not only that its process lives), and whoever depends on it reads
`Ledger.beat_seen()`: `opledger check` (fails when it is missing), the workers (log it
once), the metrics (`opledger_beat_last_seen_age_seconds`) and the agents' answers about an
operation waiting on the relay ("waits for beat, not seen since ...").

How long without a heartbeat counts as "no beat" is the reader's setting
(`OPLEDGER_BEAT_MISSING_AFTER_SECONDS`); `DEFAULT_MISSING_AFTER` where none is given.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pydantic import AwareDatetime

from .base import LedgerBase
from .models import Record
from .queries.beat import BEAT_HEARTBEAT, BEAT_SEEN

#: how long without a heartbeat counts as "no beat" when nothing else is said: four sweep
#: intervals of the default 15 s; the beat writes every few seconds
DEFAULT_MISSING_AFTER = timedelta(seconds=60)

#: what to do about it, said wherever a missing beat is
START_BEAT = "start one with `opledger beat` (exactly one per ledger)"


class BeatSeen(Record):
    """The last beat the ledger saw, as its heartbeat says; `seen_at` None: none ever ran
    against this ledger."""

    host: str | None = None
    pid: int | None = None
    #: when that beat started (its own clock)
    started_at: AwareDatetime | None = None
    #: its last tick (the database's clock)
    seen_at: AwareDatetime | None = None
    #: the database's time when this was read
    read_at: AwareDatetime

    @property
    def ever(self) -> bool:
        """Whether any beat ever ran against this ledger."""
        return self.seen_at is not None

    @property
    def age(self) -> timedelta | None:
        """How long ago its last tick was; None when none ever ran."""
        return None if self.seen_at is None else max(self.read_at - self.seen_at, timedelta(0))

    def missing(self, after: timedelta = DEFAULT_MISSING_AFTER) -> bool:
        """Whether no beat ticked within `after` (or none ever ran)."""
        age = self.age
        return age is None or age > after

    def who(self) -> str:
        """The beat as "host h, pid p, running since ..." (or that none ran)."""
        if self.seen_at is None:
            return "no beat has ever run against this ledger"
        since = f", running since {_at(self.started_at)}" if self.started_at else ""
        return f"host {self.host}, pid {self.pid}{since}"

    def since(self) -> str:
        """When it was last seen, in words: "not seen since 2026-12-10T12:00:03+00:00
        (75 s ago)", or that none ever ran."""
        if self.seen_at is None or self.age is None:
            return "none has ever run against this ledger"
        return f"not seen since {_at(self.seen_at)} ({self.age.total_seconds():.0f} s ago)"


def _at(value: datetime | None) -> str:
    return "?" if value is None else value.isoformat(timespec="seconds")


class Beats(LedgerBase):
    """The beat's heartbeat: written by the running beat, read by whoever depends on it."""

    def beat_heartbeat(self, *, host: str, pid: int, started_at: datetime) -> None:
        """The running beat ticked: record who it is, since when, and now (one statement)."""
        with self._single() as conn:
            conn.execute(BEAT_HEARTBEAT, {"host": host, "pid": pid, "started_at": started_at})

    def beat_seen(self) -> BeatSeen:
        """The last beat seen (one statement, by primary key)."""
        with self._single() as conn:
            row = conn.execute(BEAT_SEEN).one()
        return beat_seen_of(row)


def beat_seen_of(row: Any) -> BeatSeen:
    """One row of `BEAT_SEEN` as a `BeatSeen`."""
    return BeatSeen(
        host=row.host,
        pid=row.pid,
        started_at=row.started_at,
        seen_at=row.seen_at,
        read_at=row.db_now,
    )


__all__ = ["DEFAULT_MISSING_AFTER", "START_BEAT", "BeatSeen", "Beats", "beat_seen_of"]
