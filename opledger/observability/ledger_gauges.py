"""What the ledger knows, read when Prometheus scrapes: a few statements, each served by
an index whose size is the backlog, never a count of the whole history.

- `opledger_operations{status,action}`: operations per open status (`prepared`,
  `dispatching`, `unknown`) and action, from the partial indexes the sweeps use. Finished
  operations (confirmed, rejected, cancelled) grow with the history, so they are not
  counted per scrape: their rates are the workers' counters
  (`opledger_dispatch_outcomes_total`, `opledger_decisions_total`), and
  `opledger_operations_estimated` is Postgres's own estimate of the table's rows (free).
- `opledger_reviews_open` and `opledger_oldest_open_review_age_seconds`;
- `opledger_oldest_prepared_age_seconds`, `opledger_oldest_unknown_age_seconds`: since the
  operation was prepared (0 when there is none).
- `opledger_operations_unserved{action}`: open operations whose action none of the
  configured adapters (`OPLEDGER_ADAPTERS` of the process serving the metrics) serves:
  workers hold them, nothing is sent, until a worker that serves the action runs. Read
  from the same rows as `opledger_operations`, no statement of its own.
- `opledger_beat_lock_held`: 1 while a beat holds its advisory lock (`pg_locks`), else 0.
- The beat's heartbeat, written by its scheduler's loop every few seconds (one row, read
  by its key): `opledger_beat_last_seen_timestamp_seconds` (unix time of its last tick; 0
  when no beat ever ran against this ledger) and `opledger_beat_last_seen_age_seconds`
  (how long ago, by the database's clock; +Inf when none ever ran), so an alert on the age
  fires for a beat that stopped and for one that never started.
- Per provider that has pushed back, holds a slot or has operations waiting (one statement,
  `Ledger.providers`'s): `opledger_provider_paused` 1 while claims for it are held back
  (an open breaker, or a "not now" still in force), `opledger_provider_paused_since_seconds`
  when that pause began (unix time; 0 when not paused), `opledger_provider_breaker_open`,
  `opledger_provider_refusals` (consecutive refused connections, fleet-wide),
  `opledger_provider_in_flight` (its concurrency slots held now) and
  `opledger_operations_waiting_capacity` (prepared operations deferred for its room).
- The ledger's own durability (`opledger switches`): `opledger_ledger_epoch` (0 until a
  failover or a restore was noticed), `opledger_ledger_switch_timestamp_seconds` (when the
  newest switch was recorded, unix time; 0 when none), `opledger_orphan_receipts_unmatched`
  (providers' answers to claims the ledger forgot, not tied to an operation yet) and
  `opledger_ledger_sync_standbys` (synchronous standbys the ledger's commits wait for: 0
  means a failover can lose committed work; -1 when the role may not see them).
- `opledger_ledger_up`: 1 when the ledger answered this scrape, else 0 (and nothing else).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from opledger.ledger.beats import BeatSeen, beat_seen_of
from opledger.ledger.connector import Connector
from opledger.ledger.pgschema import beat_lock_key, lock_words
from opledger.ledger.providers import ProviderState, provider_state
from opledger.ledger.queries import gauges as q
from opledger.ledger.queries.beat import BEAT_SEEN
from opledger.ledger.queries.providers import PROVIDERS

log = logging.getLogger("opledger.metrics")


def configured_actions() -> tuple[str, ...] | None:
    """The actions the configured adapters serve (`OPLEDGER_ADAPTERS`), or None when they
    cannot be built here (logged: the unserved gauge is then left out, the rest stays)."""
    try:
        from opledger.adapters.registry import load_registry
        from opledger.settings import get_settings

        registry = load_registry(get_settings())
    except Exception as exc:
        log.warning("cannot load the adapters (OPLEDGER_ADAPTERS): %s; no unserved gauge", exc)
        return None
    try:
        return registry.actions
    finally:
        registry.close()


@dataclass(frozen=True)
class _Scrape:
    """What one scrape read, in one snapshot of the ledger."""

    by_status: Sequence[Any]  #: (status, action, n, age of the oldest) rows
    reviews: int
    oldest_review: float
    approvals: int
    oldest_approval: float
    estimated: int | None
    beat_held: bool
    beat: BeatSeen
    providers: list[ProviderState]
    durability: tuple[Any, ...]


class LedgerCollector(Collector):
    """Reads the ledger's gauges from `engine` (a SQLAlchemy engine) on every collect.

    `actions` are the actions the adapters serve; given, open operations naming any other
    are counted as `opledger_operations_unserved`."""

    def __init__(self, engine: Any, actions: Collection[str] | None = None) -> None:
        self.engine = engine
        self.db = Connector(engine)
        #: the lock the beat of this engine's ledger holds (its schema's)
        self.beat_lock_key = beat_lock_key(self.db.schema)
        self.actions = None if actions is None else frozenset(actions)

    def _read(self) -> _Scrape:
        with self.db.snapshot() as conn:
            by_status = conn.execute(q.BY_STATUS_AND_ACTION).all()
            reviews, oldest_review = conn.execute(q.OPEN_REVIEWS).one()
            approvals, oldest_approval = conn.execute(q.PENDING_APPROVALS).one()
            estimated = conn.execute(q.ESTIMATED_ROWS).scalar()
            holder = conn.execute(q.BEAT_LOCK_HOLDER, lock_words(self.beat_lock_key)).first()
            beat = beat_seen_of(conn.execute(BEAT_SEEN).one())
            providers = [provider_state(r) for r in conn.execute(PROVIDERS).all()]
            durability = tuple(conn.execute(q.DURABILITY).one())
        return _Scrape(
            by_status,
            reviews,
            float(oldest_review),
            approvals,
            float(oldest_approval),
            estimated,
            holder is not None,
            beat,
            providers,
            durability,
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("opledger_ledger_up", "1 when the ledger answered this scrape.")
        try:
            scrape = self._read()
        except Exception as exc:  # an unreachable ledger is a metric, not a failed scrape
            log.warning("cannot read the ledger's gauges: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from self._operations(scrape.by_status)
        for name, doc, value in (
            ("opledger_reviews_open", "Reviews waiting for a person.", scrape.reviews),
            (
                "opledger_oldest_open_review_age_seconds",
                "Age of the oldest open review; 0 when none.",
                scrape.oldest_review,
            ),
            (
                "opledger_approvals_pending",
                "Acts held for a person's approval (nothing sent before it).",
                scrape.approvals,
            ),
            (
                "opledger_oldest_pending_approval_age_seconds",
                "Age of the oldest approval request still pending; 0 when none.",
                scrape.oldest_approval,
            ),
            (
                "opledger_operations_estimated",
                "Postgres's estimate of the operations table's rows (history included).",
                float(scrape.estimated or 0),
            ),
            (
                "opledger_beat_lock_held",
                "1 while a beat holds its advisory lock, else 0.",
                1 if scrape.beat_held else 0,
            ),
        ):
            yield _gauge(name, doc, value)
        yield from beat_gauges(scrape.beat)
        yield from durability_gauges(*scrape.durability)
        yield from provider_gauges(scrape.providers)

    def _operations(self, by_status: Sequence[Any]) -> Iterator[GaugeMetricFamily]:
        """Open operations by status and action, the unserved ones, the oldest ages."""
        ops = GaugeMetricFamily(
            "opledger_operations",
            "Operations in an open status (prepared, dispatching, unknown), by action.",
            labels=["status", "action"],
        )
        oldest = dict.fromkeys(q.OPEN_STATUSES, 0.0)
        unserved: dict[str, int] = {}
        for status, action, n, age in by_status:
            ops.add_metric([status, action], n)
            oldest[status] = max(oldest[status], float(age or 0))
            if self.actions is not None and action not in self.actions:
                unserved[action] = unserved.get(action, 0) + int(n)
        seen = {row[0] for row in by_status}
        for status in q.OPEN_STATUSES:  # a zero series per status, so alerts see it fall
            if status not in seen:
                ops.add_metric([status, ""], 0)
        yield ops
        if self.actions is not None:
            held = GaugeMetricFamily(
                "opledger_operations_unserved",
                "Open operations whose action no configured adapter serves (held, not sent), "
                "by action.",
                labels=["action"],
            )
            for action, n in sorted(unserved.items()):
                held.add_metric([action], n)
            if not unserved:  # a zero series, so alerts see it fall
                held.add_metric([""], 0)
            yield held
        for status in ("prepared", "unknown"):
            yield _gauge(
                f"opledger_oldest_{status}_age_seconds",
                f"Age of the oldest {status} operation (since prepared); 0 when none.",
                oldest[status],
            )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    """A gauge of one unlabelled series."""
    gauge = GaugeMetricFamily(name, doc)
    gauge.add_metric([], value)
    return gauge


#: the provider gauges: name, help, and the value of one provider's state
PROVIDER_GAUGES: tuple[tuple[str, str, Callable[[ProviderState], float]], ...] = (
    (
        "opledger_provider_paused",
        '1 while claims for the provider are held back (an open breaker, or a "not now" '
        "still in force), else 0.",
        lambda p: 1 if p.paused else 0,
    ),
    (
        "opledger_provider_paused_since_seconds",
        "When the provider's current pause began (unix time); 0 when it is not paused.",
        lambda p: p.paused_since.timestamp() if p.paused and p.paused_since else 0,
    ),
    (
        "opledger_provider_breaker_open",
        "1 while the provider's breaker is open (it refused connections; one probe at a "
        "time), else 0.",
        lambda p: 1 if p.breaker == "open" else 0,
    ),
    (
        "opledger_provider_refusals",
        "Consecutive refused connections to the provider, across the fleet.",
        lambda p: p.failures,
    ),
    (
        "opledger_provider_in_flight",
        "Calls holding one of the provider's concurrency slots now.",
        lambda p: p.in_flight,
    ),
    (
        "opledger_operations_waiting_capacity",
        "Prepared operations deferred until their provider has room (its limits, a "
        '"not now", an open breaker).',
        lambda p: p.waiting,
    ),
)


def provider_gauges(providers: list[ProviderState]) -> Iterator[GaugeMetricFamily]:
    """One gauge family per `PROVIDER_GAUGES` entry, a series per provider (a zero series
    labelled "" when there is none, so alerts see them fall)."""
    for name, doc, value in PROVIDER_GAUGES:
        gauge = GaugeMetricFamily(name, doc, labels=["provider"])
        for p in providers:
            gauge.add_metric([p.provider], float(value(p)))
        if not providers:
            gauge.add_metric([""], 0)
        yield gauge


def beat_gauges(beat: BeatSeen) -> Iterator[GaugeMetricFamily]:
    """When the beat last ticked, and how long ago (+Inf, and 0 as its time, when no beat
    ever ran against this ledger)."""
    age = beat.age
    yield _gauge(
        "opledger_beat_last_seen_timestamp_seconds",
        "When the beat's scheduler last ticked (its heartbeat, unix time); 0 when no beat "
        "ever ran against this ledger.",
        beat.seen_at.timestamp() if beat.seen_at is not None else 0.0,
    )
    yield _gauge(
        "opledger_beat_last_seen_age_seconds",
        "Seconds since the beat's scheduler last ticked (its heartbeat); +Inf when no beat "
        "ever ran against this ledger.",
        age.total_seconds() if age is not None else float("inf"),
    )


def durability_gauges(
    epoch: int, switched_at: float, orphans: int, sync_standbys: int
) -> Iterator[GaugeMetricFamily]:
    """The ledger's epoch, its newest switch, its unmatched orphan receipts and the
    synchronous standbys its commits wait for."""
    for name, doc, value in (
        (
            "opledger_ledger_epoch",
            "The ledger's epoch: 0 until a failover or a restore was noticed, +1 each.",
            epoch,
        ),
        (
            "opledger_ledger_switch_timestamp_seconds",
            "When the newest failover or restore was recorded (unix time); 0 when none.",
            switched_at,
        ),
        (
            "opledger_orphan_receipts_unmatched",
            "Providers' answers to claims the ledger forgot, not tied to an operation yet.",
            orphans,
        ),
        (
            "opledger_ledger_sync_standbys",
            "Synchronous standbys the ledger's commits wait for (0: a failover can lose "
            "committed claims and outcomes; -1: the role may not see them).",
            sync_standbys,
        ),
    ):
        yield _gauge(name, doc, float(value or 0))
