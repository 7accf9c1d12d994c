"""The send-by window on the worker's clock, and what the decision makes of an attempt
that provably sent nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from opledger.adapters.crm import crm_contract
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import Evidence, SendWindow, SendWindowPassed
from opledger.ledger.contract import Contract
from opledger.ledger.decide import Dispatch, Wait, decide
from opledger.ledger.evidence import NOT_SENT
from opledger.ledger.window import clock

from .histories import OP_ID, T0, attempt, evidence, grant, operation

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


def test_a_claim_built_by_hand_has_no_window_to_enforce() -> None:
    window = SendWindow.unbounded()
    window.check()
    assert not window.refused


def test_once_refused_a_window_stays_refused() -> None:
    window = SendWindow.closed(OP_ID, T0)
    with pytest.raises(SendWindowPassed):
        window.check()
    window._end = clock() + 60  # even if the clock were to say otherwise
    with pytest.raises(SendWindowPassed):
        window.check()


def _not_sent(n: int) -> Evidence:
    return evidence("ambiguous", source="dispatch", attempt_n=n, code=NOT_SENT)


@pytest.mark.parametrize("contract", [KEYED, NO_DEDUP], ids=["keyed", "no-dedup"])
def test_an_attempt_whose_window_passed_is_not_in_flight(contract: Contract) -> None:
    # before its deadline, and even with no dedup and no lookup: nothing was ever sent
    decision = decide(contract, operation(), [attempt()], [_not_sent(1)], grant(), T0 + 2 * S)
    assert isinstance(decision, Dispatch)


def test_an_earlier_attempt_that_sent_still_holds_the_retry_back() -> None:
    sent = attempt(n=1)
    late = attempt(n=2, started=T0 + 25 * S)
    # the not-sent attempt's own (later) deadline does not count; the sent one's does
    decision = decide(KEYED, operation(), [sent, late], [_not_sent(2)], grant(), T0 + 26 * S)
    assert isinstance(decision, Dispatch)
    # an open attempt (a frozen worker, no outcome yet) may still be sending: it counts
    frozen = attempt(n=2, started=T0 + 25 * S, outcome=None)
    assert decide(KEYED, operation(), [sent, frozen], [], grant(), T0 + 26 * S) == Wait(
        until=T0 + 45 * S
    )
