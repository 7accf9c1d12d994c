"""A fresh success on a same-key resend after an attempt that may have applied, from a
provider that marks its replays, is a possible duplicate (`evidence.possible_duplicate`):
the contract fact, the condition over generated attempt histories, and what the presets
claim."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opledger.adapters.presets import EXPRESS_IDEMPOTENCY, PRESETS, STRIPE_V1
from opledger.adapters.stripe import stripe_contract
from opledger.ledger import Binding, Confirmed
from opledger.ledger.contract import Contract, Idempotency, Lookup
from opledger.ledger.evidence import (
    admit,
    fresh_resend,
    possible_duplicate,
    sent_attempts,
)
from opledger.ledger.models import Ambiguous
from tests.depth import examples
from tests.unit.histories import KEY, T0, attempt, claim, evidence

S = timedelta(seconds=1)
OTHER_KEY = KEY + ".k2"


def contract(marks: bool = True, lookup: str = "search", **facts: Any) -> Contract:
    return Contract(
        provider="stripe.v1",
        effect="payment",
        idempotency=Idempotency(
            kind="keyed",
            retention=timedelta(hours=24),
            after_error="replayed",
            keys_durable=True,
            payload_checked=True,
            concurrent="conflict",
            marks_replays=marks,
            **facts,
        ),
        lookup=Lookup(kind=lookup),
        request_timeout=10 * S,
        max_in_flight=20 * S,
    )


def success(replayed: bool = False) -> Confirmed:
    return Confirmed(
        receipt_id="ch_2",
        binding=Binding(idempotency_key=KEY),
        detail={"status": 200, "replayed": replayed},
    )


def answered(n: int, code: str, **detail: Any) -> Any:
    return evidence("ambiguous", source="dispatch", attempt_n=n, code=code, **detail)


LOST = "connection_lost"

# -- the case, and what is not one --------------------------------------------------


def test_a_fresh_success_after_an_answer_lost_with_the_request_sent_is_a_possible_duplicate() -> (
    None
):
    """The provider restarted between our send and our lookup: the list found nothing, the
    resend under the same key charged again, and Stripe's answer was not a replay."""
    first = attempt(1)
    history = [answered(1, LOST), evidence("absent", at=T0 + 25 * S)]
    outcome = admit(contract(), claim(2), success())
    assert [a.n for a in possible_duplicate(contract(), claim(2), outcome, [first], history)] == [1]


@pytest.mark.parametrize(
    ("why", "kwargs"),
    [
        ("a replay is the first request's stored answer", {"replayed": True}),
        ("a provider that marks no replays tells nothing", {"marks": False}),
    ],
)
def test_a_replay_or_an_unmarking_provider_is_no_possible_duplicate(
    why: str, kwargs: dict[str, Any]
) -> None:
    terms = contract(marks=kwargs.get("marks", True))
    outcome = admit(terms, claim(2), success(replayed=kwargs.get("replayed", False)))
    assert possible_duplicate(terms, claim(2), outcome, [attempt(1)], [answered(1, LOST)]) == (), (
        why
    )


def test_a_first_attempt_and_a_refusal_are_never_one() -> None:
    assert not fresh_resend(contract(), claim(1), success())
    assert possible_duplicate(contract(), claim(1), success(), [], []) == ()
    ambiguous = Ambiguous(code="server_error", reason="HTTP 500")
    assert possible_duplicate(contract(), claim(2), ambiguous, [attempt(1)], []) == ()
    # without a contract (the ledger's own API) nothing is known of replays
    assert possible_duplicate(None, claim(2), success(), [attempt(1)], []) == ()


@pytest.mark.parametrize(
    ("earlier", "why"),
    [
        (answered(1, "not_sent", why="no_connection"), "never reached the provider"),
        (answered(1, "not_sent", why="window_passed"), "its send window had passed"),
        (answered(1, "in_flight"), "refused while another request with the key ran"),
    ],
)
def test_an_earlier_attempt_that_applied_nothing_makes_no_duplicate(earlier: Any, why: str) -> None:
    assert possible_duplicate(contract(), claim(2), success(), [attempt(1)], [earlier]) == (), why


def test_an_earlier_attempt_under_another_key_is_not_counted() -> None:
    """Only the key the provider should have remembered says anything: under another key
    (an operator's new-key retry) a fresh success is what anyone would get."""
    old = attempt(1, key=OTHER_KEY)
    assert possible_duplicate(contract(), claim(2), success(), [old], [answered(1, LOST)]) == ()


def test_an_authoritative_absence_after_the_deadline_clears_the_earlier_attempt() -> None:
    terms = contract(lookup="status_api")
    first = attempt(1)  # in flight until T0 + 20 s
    after = evidence("absent", at=T0 + 21 * S)
    assert possible_duplicate(terms, claim(2), success(), [first], [answered(1, LOST), after]) == ()
    # before the deadline the request may still have arrived: no proof
    early = evidence("absent", at=T0 + 5 * S)
    assert possible_duplicate(terms, claim(2), success(), [first], [answered(1, LOST), early])
    # a search's absence proves nothing (rule 6)
    search = contract(lookup="search")
    assert possible_duplicate(search, claim(2), success(), [first], [answered(1, LOST), after])


# -- the fact, and who claims it ------------------------------------------------------------


def test_marks_replays_needs_keys() -> None:
    with pytest.raises(ValueError, match="marks_replays needs a keyed contract"):
        Idempotency(kind="none", marks_replays=True)


def test_stripe_marks_replays_and_express_idempotency_does_not() -> None:
    assert STRIPE_V1.idempotency.marks_replays
    assert stripe_contract().idempotency.marks_replays  # the adapter's contract keeps it
    assert not EXPRESS_IDEMPOTENCY.idempotency.marks_replays
    # only Stripe v1 documents a marker opledger's adapters read (Idempotent-Replayed)
    assert [p for p, c in PRESETS.items() if c.idempotency.marks_replays] == ["stripe.v1"]


# -- over generated histories ---------------------------------------------------------------

#: what an earlier attempt's answer may have been: its code (None: no answer was recorded,
#: the worker died) and the detail it carried
ANSWERS: list[tuple[str | None, dict[str, Any]]] = [
    (None, {}),
    (LOST, {}),
    ("timeout", {}),
    ("server_error", {"replayed": False}),
    ("state_conflict", {}),
    ("throttled", {}),
    ("in_flight", {}),
    ("not_sent", {"why": "no_connection"}),
    ("not_sent", {"why": "window_passed"}),
    ("not_sent", {"why": "no_adapter"}),
]
#: the answers after which the request provably applied nothing (with `contract()`)
APPLIED_NOTHING = {"in_flight", "not_sent"}

histories = st.lists(st.tuples(st.sampled_from(ANSWERS), st.booleans()), min_size=0, max_size=6)


@settings(max_examples=examples(800), deadline=None)
@given(
    history=histories,
    marks=st.booleans(),
    replayed=st.booleans(),
    throttle_applies_nothing=st.booleans(),
)
def test_a_possible_duplicate_is_exactly_an_earlier_same_key_attempt_that_may_have_applied(
    history: list[tuple[tuple[str | None, dict[str, Any]], bool]],
    marks: bool,
    replayed: bool,
    throttle_applies_nothing: bool,
) -> None:
    terms = contract(marks=marks)
    terms = terms.model_copy(
        update={
            "limits": terms.limits.model_copy(
                update={"throttle_applies_nothing": throttle_applies_nothing}
            )
        }
    )
    attempts, recorded = [], []
    for i, ((code, detail), same_key) in enumerate(history, start=1):
        attempts.append(
            attempt(i, started=T0 + 30 * S * (i - 1), key=KEY if same_key else OTHER_KEY)
        )
        if code is not None:
            recorded.append(answered(i, code, **detail))
    now = claim(len(history) + 1)
    outcome = admit(terms, now, success(replayed=replayed))
    found = possible_duplicate(terms, now, outcome, attempts, recorded)

    nothing = APPLIED_NOTHING | ({"throttled"} if throttle_applies_nothing else set())
    may_have_applied = [
        a.n
        for a, ((code, _), same_key) in zip(attempts, history, strict=True)
        if same_key and code not in nothing
    ]
    expected = may_have_applied if marks and not replayed else []
    assert [a.n for a in found] == expected
    # whatever it finds, the decision would have counted as possibly sent
    assert {a.n for a in found} <= {a.n for a in sent_attempts(terms, attempts, recorded)}
    if found:
        assert fresh_resend(terms, now, outcome) and now.attempt_n > 1
