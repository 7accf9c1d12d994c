"""What one call's outcome says about its provider, as the outcome statement records it.

Pure: the worker's outcome is classified here, and the ledger's outcome statement
(`queries.RECORD_OUTCOME`, through the database function `opledger_press`) applies it to
the provider's row in the same round trip:

- "answered": the provider answered (any response, a refusal included): it is reachable,
  its consecutive refusals start again from zero and an open breaker closes;
- "refused": the connection was never made (refused, timed out while connecting): one more
  consecutive refusal, and at `Limits.breaker_after` the breaker opens;
- "throttled": the provider said "not now": nothing is claimed for it before the wait it
  asked for (its Retry-After, within `Limits.retry_after_max`) has passed;
- "none": nothing learned about the provider (our own send window passed, our own pool
  was exhausted, or the answer was lost: the provider may be slow, not down).

Whether the call's concurrency slot goes back now (`release`) is decided alongside: only
once the call is known to have finished at the provider. A call whose answer was lost may
still be executing there, so its slot stays taken until the attempt's in-flight deadline.
A slot given back wakes the provider's oldest operation deferred for room (the same
statement makes it due and names it for the worker to publish).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .contract import Limits
from .evidence import (
    BINDING_MISMATCH,
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    KEY_POISONED,
    NOT_SENT,
    SERVER_ERROR,
    STATE_CONFLICT,
    THROTTLED,
    UNBOUND_RESPONSE,
    UNCODED_REFUSAL,
    asked_wait,
    never_reached,
)
from .models import Ambiguous, Outcome

Press = Literal["answered", "refused", "throttled", "none"]

#: ambiguous codes that carry the provider's own answer (the call finished there)
ANSWERED_CODES = frozenset(
    {
        IN_FLIGHT,
        IDEMPOTENCY_MISMATCH,
        KEY_POISONED,
        SERVER_ERROR,
        STATE_CONFLICT,
        BINDING_MISMATCH,
        UNBOUND_RESPONSE,
        UNCODED_REFUSAL,
        "unreadable_response",
    }
)


@dataclass(frozen=True)
class Pressure:
    """What the outcome statement does to the provider's row and the call's slot."""

    kind: Press
    release: bool
    pause: timedelta | None = None
    reason: str | None = None


def pressure_of(outcome: Outcome, limits: Limits) -> Pressure:
    """What `outcome` says about its provider (see the module's docstring)."""
    if not isinstance(outcome, Ambiguous):  # confirmed or rejected: the provider answered
        return Pressure("answered", release=True)
    code = outcome.code
    if code == THROTTLED:
        wait = asked_wait(outcome.detail, limits)
        status, smtp = outcome.detail.get("status"), outcome.detail.get("smtp_code")
        said = f"HTTP {status}" if status else f"SMTP {smtp}" if smtp else 'a "not now"'
        return Pressure(
            "throttled",
            release=True,
            pause=wait,
            reason=f"the provider asked to wait {wait.total_seconds():g} s ({said})",
        )
    if code == NOT_SENT:
        if never_reached(outcome):
            return Pressure(
                "refused",
                release=True,
                reason=f"refusing connections ({outcome.reason[:200]})",
            )
        return Pressure("none", release=True)
    if code in ANSWERED_CODES or isinstance(outcome.detail.get("status"), int):
        return Pressure("answered", release=True)
    return Pressure("none", release=False)
