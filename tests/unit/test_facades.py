"""`Ledger` satisfies each narrow protocol its callers are written against
(`opledger.ledger.facades`): checked by mypy (the assignments below) and at runtime."""

from __future__ import annotations

import pytest

from opledger.dev.memory import MemoryLedger
from opledger.ledger import Ledger
from opledger.ledger.connector import ledger_engine
from opledger.ledger.facades import (
    BeatLedger,
    ConsoleLedger,
    GrantLedger,
    IntentLedger,
    ReviewQueue,
    WorkerLedger,
)
from opledger.ledger.reviews import Reviews


@pytest.fixture
def ledger() -> Ledger:
    """A ledger that never connects: nothing here runs a statement."""
    engine = ledger_engine("postgresql://nobody@127.0.0.1:1/none", schema="opledger")
    return Ledger(engine, schema="opledger")


def test_a_ledger_is_each_narrow_ledger(ledger: Ledger) -> None:
    worker: WorkerLedger = ledger
    intents: IntentLedger = ledger
    beat: BeatLedger = ledger
    grants: GrantLedger = ledger
    console: ConsoleLedger = ledger
    reviews: ReviewQueue = ledger.reviews
    for each, protocol in [
        (worker, WorkerLedger),
        (intents, IntentLedger),
        (beat, BeatLedger),
        (grants, GrantLedger),
        (console, ConsoleLedger),
        (reviews, ReviewQueue),
    ]:
        assert isinstance(each, protocol), protocol.__name__
    assert isinstance(ledger.reviews, Reviews)


def test_the_in_memory_twin_is_a_worker_ledger_and_no_more() -> None:
    twin: WorkerLedger = MemoryLedger()
    assert isinstance(twin, WorkerLedger)
    assert not isinstance(twin, BeatLedger) and not isinstance(twin, IntentLedger)
