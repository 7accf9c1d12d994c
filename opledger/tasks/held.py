"""Operations no adapter of this worker serves (a rolling deploy, a mistyped action): when
they are tried again, and the warning that says so once per operation."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from opledger.ledger import Operation

log = logging.getLogger("opledger.worker")

#: a held operation (no adapter of this worker serves its action) is tried again after a
#: quarter of the time it has been open, never sooner than HOLD_MIN nor later than HOLD_MAX
HOLD_MIN = timedelta(seconds=30)
HOLD_MAX = timedelta(minutes=15)

#: held operations this process has logged a warning about (bounded: cleared when full)
_held_announced: set[str] = set()
_HELD_ANNOUNCED_MAX = 10_000


def hold_until(op: Operation, now: datetime) -> datetime:
    """When a held operation is tried again: after a quarter of the time it has been open,
    within `HOLD_MIN` and `HOLD_MAX` (a bounded backoff read from the clock alone)."""
    return now + min(HOLD_MAX, max(HOLD_MIN, (now - op.created_at) / 4))


def announce_held(op: Operation) -> None:
    """A warning naming the operation and its action, once per operation in this process."""
    fields = {"op_id": op.id, "tenant": op.tenant, "action": op.action, "fence": op.fence}
    if op.id in _held_announced:
        log.debug("%s still held: no adapter serves %s", op.id, op.action, extra=fields)
        return
    if len(_held_announced) >= _HELD_ANNOUNCED_MAX:
        _held_announced.clear()
    _held_announced.add(op.id)
    log.warning(
        "%s held, not sent: no adapter of this worker serves %s; checked again until a worker "
        "whose adapters (OPLEDGER_ADAPTERS) serve it takes it (held longer than "
        "OPLEDGER_REVIEW_AFTER_SECONDS, a person is asked)",
        op.id,
        op.action,
        extra=fields,
    )
