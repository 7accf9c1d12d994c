"""What one process has seen of the ledger's database, to notice when the ledger went back.

A failover to a standby that was behind, or a restore, gives the ledger back an earlier
state: claims, outcomes and whole operations that workers acted on are gone. Each claim and
outcome statement asks the database where it stands (`opledger_epoch_check`: the newest
epoch recorded, the server's timeline, its WAL positions) against what this process saw
last; the answer is remembered here. Pure bookkeeping, no I/O: the store keeps one
`Witness` per process (a forked child inherits what its parent saw).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


def lsn_number(lsn: str) -> int:
    """A WAL position as Postgres writes it ("16/B374D848") as one number."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(number: int) -> str:
    """`lsn_number`'s inverse."""
    return f"{number >> 32:X}/{number & 0xFFFFFFFF:X}"


@dataclass
class Witness:
    """The newest epoch, the timeline and the furthest durable WAL position this process
    has seen of the ledger's database. `wal` is whether the server lets them be read (None:
    not asked yet); without it no switch can be noticed, and nothing is checked."""

    epoch: int = -1
    timeline: int | None = None
    flushed: int = 0
    wal: bool | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def params(self) -> dict[str, Any]:
        """What a statement checks the database against (`queries.epochs.FRESH`)."""
        with self._lock:
            # the same types every time (never None): psycopg prepares a statement per
            # set of parameter types, and a hot statement is prepared once per connection
            return {
                "seen_epoch": self.epoch,
                "seen_timeline": -1 if self.timeline is None else self.timeline,
                "seen_lsn": lsn_text(self.flushed),
                "wal": bool(self.wal),
            }

    def saw(self, epoch: int | None, timeline: int | None, flushed: str | None) -> None:
        """A statement found the ledger at `epoch`, on `timeline`, durable up to `flushed`
        (and consistent with what was seen before: its check passed)."""
        if epoch is None:
            return
        with self._lock:
            if epoch > self.epoch or timeline != self.timeline:
                # a newer epoch (recorded by another process) or the first sight: start over
                self.epoch, self.timeline = epoch, timeline
                self.flushed = lsn_number(flushed) if flushed else 0
            elif flushed:
                self.flushed = max(self.flushed, lsn_number(flushed))

    def probed(
        self, readable: bool, timeline: int | None = None, flushed: str | None = None
    ) -> None:
        """Whether the server lets its timeline and WAL position be read, and what they
        were when asked (no epoch yet: the first statement reads it)."""
        with self._lock:
            self.wal = readable
            if readable and self.epoch < 0:
                self.timeline = timeline
                self.flushed = lsn_number(flushed) if flushed else 0

    def adopt(self, epoch: int, timeline: int | None, flushed: str | None) -> None:
        """After a switch was recorded (or found recorded): the ledger as it is now."""
        with self._lock:
            self.epoch, self.timeline = epoch, timeline
            self.flushed = lsn_number(flushed) if flushed else 0
