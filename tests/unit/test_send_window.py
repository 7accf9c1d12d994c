"""The send-by window on the worker's clock, and what the decision makes of an attempt
that provably sent nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from opledger.adapters.crm import crm_contract
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import SendWindow, SendWindowPassed
from opledger.ledger.decide import NOT_SENT, Dispatch, Review, Wait, decide
from opledger.ledger.window import clock

from .histories import OP_ID, T0, attempt, grant, operation

S = timedelta(seconds=1)
KEYED = crm_contract(request_timeout=10 * S, max_in_flight=20 * S, lookup="none")
NO_DEDUP = smtp_contract(request_timeout=10 * S)


def test_the_window_counts_from_the_reading_taken_before_the_claim() -> None:
    window = SendWindow(op_id=OP_ID, send_by=T0, length=timedelta(seconds=0.2), opened=clock())
    assert 0.1 < window.remaining() <= 0.2
    window.check()
    time.sleep(0.25)
    with pytest.raises(SendWindowPassed):
        window.check()
    assert window.refused


def test_once_refused_a_window_stays_refused() -> None:
    window = SendWindow.closed(OP_ID, T0)
    with pytest.raises(SendWindowPassed):
        window.check()
    window._end = clock() + 60  # even if the clock were to say otherwise
    with pytest.raises(SendWindowPassed):
        window.check()


@pytest.mark.parametrize("contract", [KEYED, NO_DEDUP], ids=["keyed", "no-dedup"])
def test_an_attempt_that_sent_nothing_is_not_in_flight(contract: object) -> None:
    late = attempt(outcome=NOT_SENT)
    # before its deadline, and even with no dedup and no lookup: nothing was ever sent
    decision = decide(contract, operation(), [late], [], grant(), T0 + 2 * S)  # type: ignore[arg-type]
    assert isinstance(decision, Dispatch)


def test_an_earlier_attempt_that_sent_still_holds_the_retry_back() -> None:
    sent = attempt(n=1, outcome="ambiguous")
    late = attempt(n=2, started=T0 + 25 * S, outcome=NOT_SENT)
    assert decide(KEYED, operation(), [sent], [], grant(), T0 + 5 * S) == Wait(until=T0 + 20 * S)
    # the not-sent attempt's own (later) deadline does not count; the sent one's does
    assert isinstance(decide(KEYED, operation(), [sent, late], [], grant(), T0 + 26 * S), Dispatch)
    # an open attempt (no outcome yet) may still be sending: it counts
    open_ = attempt(n=2, started=T0 + 25 * S, outcome=None)
    assert decide(KEYED, operation(), [sent, open_], [], grant(), T0 + 26 * S) == Wait(
        until=T0 + 45 * S
    )


def test_claims_that_keep_missing_the_window_go_to_a_person() -> None:
    misses = [attempt(n=n, outcome=NOT_SENT) for n in range(1, KEYED.max_attempts + 1)]
    decision = decide(KEYED, operation(), misses, [], grant(), T0 + S)
    assert isinstance(decision, Review) and "send-by window" in decision.reason


def test_revoked_authority_stops_even_a_first_send() -> None:
    decision = decide(KEYED, operation(), [attempt(outcome=NOT_SENT)], [], grant(True), T0 + S)
    assert isinstance(decision, Review) and "revoked" in decision.reason
