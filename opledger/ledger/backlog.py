"""The backlog guard: how many messages a sweep may publish into a queue right now.

The relay and the sweep publish again what may have been lost. Under a backlog the
original message is usually not lost but *late*; publishing again would only lengthen the
queue every worker must drain (congestive collapse). So each run samples the queue's
depth and publishes only into headroom:

- the **drain rate** is measured between consecutive samples: from a counter of what the
  workers consumed where the caller has one (for dispatch: the claims the ledger
  numbered), else from the depth left after the last run's publishes minus the depth now
  (a lower bound while others publish too); it decays slowly, so one quiet interval does
  not forget it;
- the queue is **shallow** when it holds no more than the workers drain in two intervals
  (at least a hundredth of the batch, so an idle queue can show its drain);
- a run may fill it up to that mark and no further: a message published now is consumed
  within about two intervals, well before anything would publish it again, and the
  estimate can double each interval while the workers keep up;
- the relay additionally waits until the queue has been shallow for ``hold_for`` (its
  ``after`` setting): a message that was queued behind a backlog had that long to arrive.

Pure (no I/O, no clock): the ledger stores the state in ``queue_guards`` and passes `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import NamedTuple

#: the relay's wait after a publish doubles with each re-publication, at most this often
RELAY_MAX_DOUBLINGS = 4


class Handout(NamedTuple):
    """An operation handed to a queue, with the generation its message carries."""

    op_id: str
    gen: int


#: half-life of the measured drain rate when nothing shows the workers draining
DRAIN_HALF_LIFE = timedelta(seconds=60)


@dataclass(frozen=True)
class GuardState:
    """What ``queue_guards`` keeps for one queue between two runs."""

    sampled_at: datetime | None = None
    depth_after: int | None = None  #: depth right after the last run's publishes
    counter: int | None = None  #: the consumption counter at the last sample
    drain_per_s: float = 0.0
    shallow_since: datetime | None = None


@dataclass(frozen=True)
class Plan:
    """How many messages this run may publish, and the state to store (the caller adds
    what it published to ``depth_after``)."""

    allowed: int
    state: GuardState
    shallow: bool


def plan(
    state: GuardState,
    *,
    depth: int | None,
    now: datetime,
    counter: int | None = None,
    interval: timedelta,
    limit: int,
    hold_for: timedelta = timedelta(0),
) -> Plan:
    """The publishing budget of one run.

    `depth` None means the queue could not be read: no global guard then (each
    operation's own backoff still applies), so an unreadable depth never stops recovery.
    """
    if depth is None:
        return Plan(allowed=limit, state=replace(state, sampled_at=None), shallow=True)
    if state.sampled_at is not None and (now - state.sampled_at) < interval / 2:
        # Two runs close together (an overlap) would divide noise by almost nothing: keep
        # the reference sample (its time, depth and counter; what is published now adds
        # to its depth), so the next run measures over the whole span.
        return _budget(state, depth, now, interval, limit, hold_for)
    drain = state.drain_per_s
    if state.sampled_at is not None:
        elapsed = (now - state.sampled_at).total_seconds()
        decayed = drain * 0.5 ** (elapsed / DRAIN_HALF_LIFE.total_seconds())
        if counter is not None and state.counter is not None:
            drained = counter - state.counter  # a wiped queue is no sign of draining
        else:
            drained = (state.depth_after or 0) - depth
        drain = max(max(0, drained) / elapsed, decayed)
    new = GuardState(
        sampled_at=now,
        depth_after=depth,
        counter=counter,
        drain_per_s=drain,
        shallow_since=state.shallow_since,
    )
    return _budget(new, depth, now, interval, limit, hold_for)


def _budget(
    state: GuardState,
    depth: int,
    now: datetime,
    interval: timedelta,
    limit: int,
    hold_for: timedelta,
) -> Plan:
    # The queue may hold what the workers drain in two intervals (at least a small floor,
    # so an idle queue can show its drain and the estimate double each interval); a
    # message published into it waits about that long. Deeper than that is a backlog.
    floor = max(1, limit // 100)
    fill = max(floor, 2 * state.drain_per_s * interval.total_seconds())
    shallow = depth <= fill
    since = (state.shallow_since or now) if shallow else None
    held = not shallow or now - (since or now) < hold_for
    allowed = 0 if held else max(0, min(limit, math.floor(fill - depth)))
    return Plan(
        allowed=allowed,
        state=replace(state, shallow_since=since),
        shallow=shallow,
    )
