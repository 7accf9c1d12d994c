"""Beat's scheduler: Celery's persistent scheduler, whose first broker connection waits
out a broker that refuses it.

Celery's beat opens its producer's connection at its first tick and retries it only on the
transport's *recoverable* errors (a refused socket, a forced close), up to
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
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler
from kombu.exceptions import OperationalError

log = logging.getLogger("opledger.beat")

#: seconds between two connection attempts after a refusal: doubling up to the cap
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 30.0


class Scheduler(PersistentScheduler):  # type: ignore[misc]
    """`PersistentScheduler` whose broker connection outlives the broker's refusals."""

    #: time.sleep, replaceable in tests
    sleep = staticmethod(time.sleep)

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

    def _forget_connection(self) -> None:
        """Drop the half-open connection, so the next attempt starts from a clean one."""
        conn = self.__dict__.pop("connection", None)
        if conn is not None:
            try:
                conn.collect()
            except Exception:  # it is being thrown away
                log.debug("beat: closing a refused connection failed", exc_info=True)


__all__ = ["Scheduler"]
