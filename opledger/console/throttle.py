"""When the console refuses a sign-in attempt before checking its password: the policy, as
a pure function of the failures on record (`Accounts.signin_failures` reads them).

Failures are counted per name as typed (known or not, so an unknown name is answered
like a known one) since that name's last successful sign-in, and per client address,
both within `window`. From `after` failures on, the next attempt waits `first_wait` after
the latest failure, doubling with each further failure up to `longest_wait`. A refused
attempt checks no password and is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, kw_only=True)
class Limit:
    #: this many failures within the window start the waiting
    after: int
    first_wait: timedelta = timedelta(seconds=1)
    longest_wait: timedelta = timedelta(minutes=15)

    def wait(self, failures: int) -> timedelta | None:
        """How long after the latest failure the next attempt must wait (None: no wait)."""
        if failures < self.after:
            return None
        doublings = min(failures - self.after, 32)
        wait: timedelta = self.first_wait * (1 << doublings)
        return min(wait, self.longest_wait)


@dataclass(frozen=True, kw_only=True)
class ThrottlePolicy:
    #: one name, whoever tries it: reset by its successful sign-in
    per_operator: Limit = Limit(after=5)
    #: one client address, whichever names it tries (several people may share one)
    per_address: Limit = Limit(after=20)
    #: failures older than this no longer count
    window: timedelta = timedelta(hours=24)


@dataclass(frozen=True, kw_only=True)
class Failures:
    """Recent failed sign-ins of one name and of one address, as the database counted them."""

    operator: int
    operator_last: datetime | None
    address: int
    address_last: datetime | None
    now: datetime


def retry_at(policy: ThrottlePolicy, failures: Failures) -> datetime | None:
    """When the next attempt may run its password check, if that is later than now."""
    times = []
    for limit, n, last in (
        (policy.per_operator, failures.operator, failures.operator_last),
        (policy.per_address, failures.address, failures.address_last),
    ):
        wait = limit.wait(n)
        if wait is not None and last is not None and last + wait > failures.now:
            times.append(last + wait)
    return max(times, default=None)
