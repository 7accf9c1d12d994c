"""A user's own Celery app as the tests build it: the settings it gives itself that meet
every guarantee opledger needs (`opledger.tasks.wiring.GUARANTEES`), so `register(app)`
adds its routes and beat entries without refusing it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

#: a user's settings that keep every guarantee
GOOD: dict[str, Any] = {
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "task_reject_on_worker_lost": False,
    "task_serializer": "json",
    "accept_content": ["json"],
    "task_time_limit": 60,
    "broker_transport_options": {"visibility_timeout": 600},
}


@contextmanager
def their_app() -> Iterator[Celery]:
    """A user's app with `GOOD` settings (no broker is reached); opledger's own app is the
    current one again afterwards, as the rest of the suite expects."""
    import opledger.tasks.app as tasks

    app = Celery("theirs", broker="redis://127.0.0.1:6379/15", set_as_current=False)
    app.conf.update(GOOD)
    try:
        yield app
    finally:
        tasks.app.set_current()
