"""What opledger asks of a Celery app, as data: its routes, its beat entries and scheduler,
and the settings its guarantees rest on.

`celeryconfig` sets them on opledger's own app; `register(app)` (`tasks.integrate`) puts
the routes and the entries on an app of yours and refuses one that differs in a guarantee.
Nothing here imports Celery, the configuration or the tasks: each of those reads this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

#: the queue of each of opledger's tasks (Celery's `task_routes`)
ROUTES: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "opledger.dispatch": {"queue": "dispatch"},
        "opledger.reconcile": {"queue": "reconcile"},
        "opledger.sweep": {"queue": "maintenance"},
        "opledger.relay": {"queue": "maintenance"},
        "opledger.purge_payloads": {"queue": "maintenance"},
        "opledger.notify_review": {"queue": "notifications"},
        "opledger.notify_approval": {"queue": "notifications"},
    }
)


def task_routes() -> dict[str, dict[str, str]]:
    """`ROUTES` as Celery's `task_routes` setting (a dict of its own)."""
    return {task: dict(route) for task, route in ROUTES.items()}


#: what Celery's `beat_scheduler` setting names: Celery's persistent scheduler, whose first
#: broker connection waits out a broker that refuses it (`tasks.beat.Scheduler`)
SCHEDULER = "opledger.tasks.beat:Scheduler"


@dataclass(frozen=True)
class BeatEntry:
    """A task beat sends every `every` seconds (none: every sweep interval)."""

    name: str
    task: str
    every: float | None = None

    def interval(self, sweep_interval: float) -> float:
        return sweep_interval if self.every is None else self.every


#: the sweep and the relay every sweep interval, the payload purge hourly
BEAT_ENTRIES: tuple[BeatEntry, ...] = (
    BeatEntry("sweep", "opledger.sweep"),
    BeatEntry("relay", "opledger.relay"),
    BeatEntry("purge-payloads", "opledger.purge_payloads", every=3600.0),
)


def beat_schedule(sweep_interval: float, *, prefix: str = "") -> dict[str, dict[str, Any]]:
    """`BEAT_ENTRIES` as Celery's `beat_schedule` setting, each entry named `prefix` + its
    name (`register(app)` names them `opledger-...`, so they never clash with yours). Each
    expires after its interval, so a late run is skipped rather than piled up."""
    schedule: dict[str, dict[str, Any]] = {}
    for entry in BEAT_ENTRIES:
        every = entry.interval(sweep_interval)
        schedule[prefix + entry.name] = {
            "task": entry.task,
            "schedule": every,  # seconds: Celery makes it a `celery.schedules.schedule`
            "options": {"expires": every},
        }
    return schedule


@dataclass(frozen=True)
class Guarantee:
    """A Celery setting opledger's guarantees rest on: the value `celeryconfig` gives it,
    what an app of yours may have instead (`accepts`), and why it matters."""

    value: Any
    why: str
    accepts: Callable[[Any], bool]

    @property
    def wanted(self) -> str:
        return repr(self.value)


#: the settings `celeryconfig` sets and `register(app)` refuses an app to differ in
GUARANTEES: Mapping[str, Guarantee] = MappingProxyType(
    {
        "task_acks_late": Guarantee(
            True,
            "a message must be acknowledged only after its task ran",
            lambda got: got is True,
        ),
        "worker_prefetch_multiplier": Guarantee(
            1, "each worker process holds one message at most", lambda got: got == 1
        ),
        "task_reject_on_worker_lost": Guarantee(
            False,
            "a killed worker's operation is the sweeper's, not a redelivery's",
            lambda got: not got,  # off: False, or Celery's default None
        ),
        "task_serializer": Guarantee(
            "json",
            "a task carries an operation id as JSON, nothing else",
            lambda got: got == "json",
        ),
    }
)

__all__ = [
    "BEAT_ENTRIES",
    "GUARANTEES",
    "ROUTES",
    "SCHEDULER",
    "BeatEntry",
    "Guarantee",
    "beat_schedule",
    "task_routes",
]
