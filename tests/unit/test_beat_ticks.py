"""Beat's scheduler sleeps until an entry is due instead of polling for it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from celery import Celery

from opledger.tasks import wiring
from opledger.tasks.beat import Scheduler


def test_beat_sleeps_until_an_entry_is_due_instead_of_polling(tmp_path: Path) -> None:
    app = Celery("ticks", set_as_current=False)
    app.conf.beat_schedule = wiring.beat_schedule(0.1)  # the sweep and the relay
    ran: list[str] = []

    class Counted(Scheduler):
        def apply_entry(self, entry: Any, producer: Any = None) -> None:
            ran.append(entry.name)

        def tick(self, *args: Any, **kwargs: Any) -> Any:
            return super(Scheduler, self).tick(*args, **kwargs)  # Celery's tick alone

    scheduler = Counted(app=app, schedule_filename=str(tmp_path / "schedule"))
    ticks = 0
    try:
        end = time.monotonic() + 0.65
        while time.monotonic() < end:  # beat's own loop (celery.beat.Service.start)
            interval = scheduler.tick()
            ticks += 1
            if interval and interval > 0:
                time.sleep(interval)
    finally:
        scheduler.close()
    assert ran.count("sweep") >= 5 and ran.count("relay") >= 5, ran  # every 0.1 s
    # a run is one tick that applies it and one that sleeps until the next; with Celery's
    # early wake-up beat ticked in a loop for the last 10 ms before each (thousands here)
    assert ticks <= 3 * len(ran) + 3, (ticks, len(ran))
