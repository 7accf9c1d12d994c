"""What the ledger knows of each provider's pressure: its pause and breaker, its slots in
use, and the operations waiting for its capacity; and the deferral of a prepared operation
whose provider has no room yet.

The state itself is written by the claim and outcome statements (`opledger_admit`,
`opledger_press`, migration 0015); this part reads it for people (`opledger providers`,
`opledger ops list`, the console, the metrics) and defers what the gate refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AwareDatetime

from .base import LedgerBase
from .errors import InvalidInput
from .ids import check_operation_id
from .models import Record
from .queries.providers import DEFER, FORGET_PROVIDER, PROVIDERS


class ProviderState(Record):
    """One provider's pressure as the ledger holds it."""

    provider: str
    #: "open" while refused connections pause dispatch to it (one probe at a time)
    breaker: str = "closed"
    #: consecutive refusals to connect, fleet-wide
    failures: int = 0
    #: nothing is claimed for it before this instant (a Retry-After, the next probe)
    paused_until: AwareDatetime | None = None
    paused_since: AwareDatetime | None = None
    pause_reason: str | None = None
    #: calls holding one of its concurrency slots now
    in_flight: int = 0
    #: prepared operations waiting for its capacity (deferred by the gate)
    waiting: int = 0
    #: the database's time when this was read
    read_at: AwareDatetime

    @property
    def paused(self) -> bool:
        """Whether claims for it are held back now (an open breaker always counts)."""
        return self.breaker == "open" or (
            self.paused_until is not None and self.paused_until > self.read_at
        )


def provider_state(row: Any) -> ProviderState:
    """One row of `PROVIDERS` as a `ProviderState`."""
    return ProviderState(
        provider=row.provider,
        breaker=row.breaker or "closed",
        failures=row.failures or 0,
        paused_until=row.paused_until,
        paused_since=row.paused_since,
        pause_reason=row.pause_reason,
        in_flight=row.in_flight,
        waiting=row.waiting,
        read_at=row.db_now,
    )


class Providers(LedgerBase):
    """Provider pressure: read for people, and the deferral of what the gate refused."""

    def providers(self) -> list[ProviderState]:
        """Every provider that has pushed back, holds a slot or has operations waiting."""
        with self._single() as conn:
            rows = conn.execute(PROVIDERS).all()
        return [provider_state(r) for r in rows]

    def forget_provider(self, provider: str) -> bool:
        """Forget what the ledger holds of `provider`'s pressure: its pause, open breaker,
        refusals in a row and rate bucket, and the slots no call holds (for a provider that
        is back, or renamed, or whose operations were all cancelled while its breaker was
        open: nothing else closes a breaker no call reaches). Calls in flight keep their
        slots; operations waiting for it are published again at their time. False when
        there was nothing to forget. The next refusals open the breaker again."""
        if not provider or len(provider) > 200:
            raise InvalidInput(f"no provider {provider!r}: a name of 1 to 200 characters")
        with self._single() as conn:
            row = conn.execute(FORGET_PROVIDER, {"provider": provider}).one()
        return bool(row.pressure or row.slots)

    def defer(self, op_id: str, *, until: datetime) -> bool:
        """Leave a prepared operation for later: its provider had no room for it (its
        limits, a "not now", an open breaker). No claim, fence or attempt: the relay
        publishes it again at `until` (`next_check_at` on a prepared operation: when room
        comes for sure), unless a call of its provider gives its slot back sooner and wakes
        it (the outcome statement), and the dispatch that finds room sends it. False when it
        is no longer prepared."""
        check_operation_id(op_id)
        with self._single() as conn:
            row = conn.execute(DEFER, {"op_id": op_id, "until": until}).one_or_none()
        return row is not None
