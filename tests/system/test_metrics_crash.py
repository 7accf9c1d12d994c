"""Scrape `opledger metrics` through a real crash: a worker is SIGKILLed right after the
provider answered, the sweeper fences its claims out, reconcile confirms what a lookup
proves and hands the rest to a person. The scrapes see the unknown count rise and fall and
the review gauge move; the killed worker's counters survive it (PROMETHEUS_MULTIPROC_DIR)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Proc, Stack, free_port, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch
from tests.intents import prepare

from .conftest import crashes, settings_of, settled, worker_with

pytestmark = pytest.mark.system

PASSWORD = "scrape-me"
KEYED, NO_DEDUP = KINDS[0], KINDS[3]  # keyed with a status API; no dedup, no lookup


def scrape(url: str) -> dict[str, float]:
    """Each metric's samples summed over their labels, by sample name."""
    body = httpx.get(url, auth=("opledger", PASSWORD), timeout=5).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            key = s.name if s.name != "opledger_operations" else f"ops:{s.labels['status']}"
            totals[key] = totals.get(key, 0.0) + s.value
    return totals


def test_scrapes_see_unknown_rise_and_fall_and_the_review_gauge_move(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    counters = running.workdir / f"prom-{uuid.uuid4().hex[:8]}"
    counters.mkdir()
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    prom: dict[str, Any] = {"PROMETHEUS_MULTIPROC_DIR": str(counters)}
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    server = Proc(
        "metrics",
        ["metrics", "--port", str(port)],
        {**running.env, **prom, "OPLEDGER_FLOWER_PASSWORD": PASSWORD},
        running.workdir / "metrics.log",
    )
    seen: list[dict[str, float]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                seen.append(scrape(url))
            time.sleep(0.15)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        wait_until(lambda: "opledger metrics on" in server.output(), 30, "opledger metrics")
        assert scrape(url)["opledger_ledger_up"] == 1
        with worker_with(
            running, "crashy", concurrency=1, OPLEDGER_CRASHPOINT="dispatch.after_call", **prom
        ) as crashy:
            op_ids = [
                prepare(sys_ledger, f"metrics-{kind.name}", action=kind.action, target=f"case-{i}")
                # in this order: the one left for review is fenced out first, so the unknown
                # count goes 0 -> 1 -> 2, and back to 1 once the keyed one is confirmed
                for i, kind in enumerate((NO_DEDUP, KEYED))
            ]
            sampler.start()
            for op_id in op_ids:
                dispatch.delay(op_id)
            wait_until(lambda: crashes(crashy) >= 2, 45, "2 crashes after the call")
            running.kill_worker("crashy")
            # a worker on the maintenance queue only: the sweep fences both claims out, and
            # nothing reconciles them until w1 starts
            sweeper = Proc(
                "sweeper",
                ["worker", "-Q", "maintenance", "-c", "1", "--hostname", "sweeper@%h"],
                {**running.env, **prom},
                running.workdir / "sweeper.log",
            )
            try:
                wait_until(lambda: scrape(url)["ops:unknown"] == 2, 30, "both operations unknown")
            finally:
                sweeper.kill()
            running.start_worker("w1", **prom)
            final = settled(sys_ledger, op_ids, timeout=60)
            assert final == {op_ids[0]: Status.UNKNOWN, op_ids[1]: Status.CONFIRMED}
            wait_until(lambda: scrape(url)["ops:unknown"] == 1, 10, "the last scrape")
            # the sampler may have last looked just before the drop that wait_until saw: stop
            # it, then take the final sample here, so the series ends after the fall
            stop.set()
            sampler.join(timeout=5)
            seen.append(scrape(url))
    finally:
        stop.set()
        if sampler.is_alive():
            sampler.join(timeout=5)
        server.kill()
    last = seen[-1] if seen else {}
    unknown = [s["ops:unknown"] for s in seen]
    reviews = [s["opledger_reviews_open"] for s in seen]
    assert unknown[0] == 0 and max(unknown) == 2, unknown  # rose with both fenced out ...
    assert unknown[unknown.index(2) :][-1] <= 1, unknown  # ... and fell as one was confirmed
    assert reviews[0] == 0 and reviews[-1] >= 1, reviews  # the other waits for a person
    assert max(s.get("ops:dispatching", 0) for s in seen) >= 1  # the dead worker's claims
    # the killed worker's counter survived it: its provider calls were timed before the kill
    assert last["opledger_provider_call_seconds_count"] >= 2, last
    assert last["opledger_decisions_total"] >= 2, last
