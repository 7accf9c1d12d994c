"""How long a maintenance transaction may hold what it holds: its `Bounds`, derived from
the interval of its cycle, and whether an error means the server ended it for outliving
them (`lost_cycle`). `ledger.maintenance` bounds every beat transaction with them, and the
sweep's switch check (`ledger.switches`) its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from .errors import DatabaseUnavailable

#: the cycle of a maintenance call not given its interval: the sweep interval's default
#: (`OPLEDGER_SWEEP_INTERVAL_SECONDS`)
DEFAULT_INTERVAL = timedelta(seconds=15)
#: no bound is shorter: a process merely descheduled for a moment keeps its transaction
#: (the development stack's sub-second sweeps are bounded by this instead)
MIN_BOUND = timedelta(seconds=1)

#: what the server says when it ended a bounded transaction: the lock it waited for
#: (lock_not_available), the session idle in it (idle_in_transaction_session_timeout)
LOST_CYCLE = {"55P03": "waited for a lock too long", "25P03": "sat idle too long"}


@dataclass(frozen=True)
class Bounds:
    """How long one maintenance transaction may wait for a lock (`lock`) and sit idle
    between its statements (`idle`) before the server ends it."""

    lock: timedelta
    idle: timedelta

    @classmethod
    def of(cls, interval: timedelta | None) -> Bounds:
        """The bounds of a transaction of a cycle of `interval` (None: `DEFAULT_INTERVAL`):
        idle at most one interval (at least `MIN_BOUND`), a lock waited for half that."""
        idle = max(interval or DEFAULT_INTERVAL, MIN_BOUND)
        return cls(lock=idle / 2, idle=idle)

    def params(self) -> dict[str, str]:
        """`BOUND_TRANSACTION`'s parameters."""
        return {"lock_ms": _ms(self.lock), "idle_ms": _ms(self.idle)}


def _ms(span: timedelta) -> str:
    return str(max(1, round(span.total_seconds() * 1000)))


def lost_cycle(exc: BaseException, *, took: timedelta, bounds: Bounds) -> str | None:
    """Why the server ended a bounded transaction that took `took`, or None when `exc`
    (SQLAlchemy's `DBAPIError`, or the ledger's `DatabaseUnavailable` over the driver's
    error) is any other error. The server says why (`LOST_CYCLE`), unless the process was
    stopped while it waited for a statement's result: then it reads only that the
    connection was closed, which a transaction that outlived its idle bound takes as its
    end (the next cycle runs, where a database that really is away is retried as ever)."""
    driver = getattr(exc, "orig", None) or exc.__cause__
    why = LOST_CYCLE.get(getattr(driver, "sqlstate", None) or "")
    if why is None and isinstance(exc, DatabaseUnavailable) and took > bounds.idle:
        why = f"lost its connection after {took.total_seconds():.1f} s"
    return why


__all__ = ["DEFAULT_INTERVAL", "LOST_CYCLE", "MIN_BOUND", "Bounds", "lost_cycle"]
