"""The send-by window of a claim, enforced at the wire.

A claim is only good for *starting* a request until its send-by instant. The ledger
computes that instant in the claim statement (the database's ``now()`` plus the window),
and the attempt's in-flight deadline is ``send_by + max_in_flight``: a retry can start
only after every request this claim could have sent must have finished.

Clocks on two machines disagree, so the worker never compares its wall clock with
``send_by``. It measures the window on its own monotonic clock instead, from a reading
taken *before* the claim statement was sent: the database's ``now()`` is later than that
reading, so the worker's end of the window is never later than ``send_by``. Where the
platform has it, the clock is ``CLOCK_BOOTTIME``, which keeps counting while the host
is suspended (``CLOCK_MONOTONIC`` stops); a process that is paused (SIGSTOP, a long GC,
a frozen VM whose clock catches up on resume) sees the pause as elapsed time.

`SendWindow.check()` is called immediately before the first byte of the request leaves:
by the shared HTTP client after the connection is set up (see
`opledger.adapters.base.http_client`), by the SMTP adapter after the envelope and before
DATA, by the worker once more before it hands the claim to the adapter. A refused check raises
`SendWindowPassed` and marks the window `refused`, so the worker records the attempt as
"not sent" whatever the adapter made of the exception.

Residual risk: a pause that falls between a passing check and the kernel accepting the
first bytes (a few microseconds of Python) is not caught. Such a request leaves late by
the length of that pause; it still cannot outlive the attempt's deadline unless the pause
plus the provider's execution time exceed `max_in_flight`, which is the slack between
what the provider actually takes and what its contract promises.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from .errors import SendWindowPassed

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)


def clock() -> float:
    """Seconds on a clock that never goes backwards and counts suspended time if it can."""
    if _CLOCK is not None:
        return time.clock_gettime(_CLOCK)
    return time.monotonic()


class SendWindow:
    """How long the holder of one claim may still start sending.

    `opened` is a `clock()` reading taken before the claim statement was sent; `length` is
    the window the database granted (``send_by - now()`` in the claim statement).
    """

    __slots__ = ("_end", "length", "op_id", "refused", "send_by")

    def __init__(self, *, op_id: str, send_by: datetime, length: timedelta, opened: float) -> None:
        self.op_id = op_id
        self.send_by = send_by
        self.length = length
        self._end = opened + length.total_seconds()
        #: a check found the window passed: nothing was sent under this claim
        self.refused = False

    def remaining(self) -> float:
        """Seconds left to start sending (negative once passed)."""
        return self._end - clock()

    def check(self) -> None:
        """Raise `SendWindowPassed` (and remember it) if the window has passed."""
        late = -self.remaining()
        if self.refused or late >= 0:
            self.refused = True
            raise SendWindowPassed(
                f"the send-by window of {self.op_id} passed {max(late, 0.0):.3f} s ago "
                f"(send by {self.send_by.isoformat()}): nothing was sent",
                op_id=self.op_id,
                late_s=max(late, 0.0),
            )

    def __repr__(self) -> str:
        return f"SendWindow({self.op_id}, remaining={self.remaining():.3f}s)"

    @classmethod
    def unbounded(cls) -> SendWindow:
        """No window (a claim built by hand for a contract probe): `check` never refuses."""
        return cls(
            op_id="-", send_by=datetime.max.replace(tzinfo=UTC), length=timedelta.max, opened=0.0
        )

    @classmethod
    def closed(cls, op_id: str, send_by: datetime) -> SendWindow:
        """A window that has already passed (for records rebuilt without a clock reading)."""
        return cls(op_id=op_id, send_by=send_by, length=timedelta(0), opened=clock() - 1.0)
