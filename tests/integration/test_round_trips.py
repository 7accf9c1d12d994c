"""The worker's happy path costs two round trips to Postgres: claim, then outcome.

Counted on the wire: libpq traces every protocol message, and each ReadyForQuery from the
server ends one round trip. BEGIN, COMMIT, pool pings and resets would all show up here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import event

from opledger.ledger import Ambiguous, Binding, ClaimTerms, Confirmed, Ledger
from opledger.ledger.contract import Limits
from tests.intents import prepare
from tests.wire import WireCounter


@pytest.fixture
def traced(database_url: str, ledger: Ledger) -> Iterator[tuple[Ledger, WireCounter]]:
    counter = WireCounter()
    traced_ledger = Ledger.from_url(database_url, pool_size=1)
    event.listen(traced_ledger.engine, "connect", counter.attach)
    yield traced_ledger, counter
    traced_ledger.engine.dispose()
    counter.file.close()


def test_claim_and_outcome_are_two_round_trips(
    traced: tuple[Ledger, WireCounter], grant: str
) -> None:
    ledger, counter = traced
    warm = prepare(ledger, "warm-up")  # first connect and dialect checks happen here
    claim = ledger.claim(warm, owner="w")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="t", reason="warm-up"))

    op_id = prepare(ledger, "measured")
    counter.start()
    claim = ledger.claim(op_id, owner="w")
    assert claim is not None
    ledger.record_outcome(
        claim, Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))
    )
    assert counter.round_trips() == 2, "\n".join(counter.messages())


def test_a_new_intent_under_a_good_grant_is_one_round_trip(
    traced: tuple[Ledger, WireCounter], grant: str
) -> None:
    """The agent's side of an effect: the grant checked, the operation, its frozen payload
    and its ask inserted, in one statement."""
    ledger, counter = traced
    prepare(ledger, "warm-up")
    counter.start()
    op_id = prepare(ledger, "counted")
    assert counter.round_trips() == 1, "\n".join(counter.messages())
    assert ledger.payload(op_id) is not None and ledger.get(op_id).status.value == "prepared"


def test_the_counter_sees_every_round_trip(traced: tuple[Ledger, WireCounter], grant: str) -> None:
    """The instrument itself: a prepare that runs after another operation takes the full
    transaction (BEGIN, grant check, the intent looked up, dependency lock, insert,
    dependency rows, COMMIT), so the counter must see seven."""
    ledger, counter = traced
    warm = prepare(ledger, "warm-up")
    prepare(ledger, "warm-up-after", after=[warm])
    counter.start()
    prepare(ledger, "counted", after=[warm])
    assert counter.round_trips() == 7, "\n".join(counter.messages())


def test_a_limited_provider_costs_no_extra_round_trip(
    traced: tuple[Ledger, WireCounter], grant: str
) -> None:
    """Its concurrency slot, rate bucket and breaker are taken in the claim statement and
    given back in the outcome statement: still two round trips."""
    ledger, counter = traced
    limits = Limits(concurrency=2, rate=1000, burst=5)
    terms = ClaimTerms(limits_by_provider={"crm": limits.claim_form()})
    warm = prepare(ledger, "warm-up")
    claim = ledger.claim(warm, owner="w", terms=terms)
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="t", reason="warm-up"), limits=limits)

    op_id = prepare(ledger, "measured")
    counter.start()
    claim = ledger.claim(op_id, owner="w", terms=terms)
    assert claim is not None
    ledger.record_outcome(
        claim,
        Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key)),
        limits=limits,
    )
    assert counter.round_trips() == 2, "\n".join(counter.messages())
    assert [p.in_flight for p in ledger.providers()] == [1]  # only the warm-up's lost answer
