"""One hand-written case per contract fact and per rule it feeds (docs/rules.md,
rules 1-3, 10, 11).

Each test states what a real provider does, and what the decision must then do.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import stripe_contract
from opledger.ledger import Ambiguous, Binding, Confirmed, Rejected, Status
from opledger.ledger.consequences import consequences
from opledger.ledger.contract import Contract
from opledger.ledger.decide import (
    AskProvider,
    Dispatch,
    HoldUnknown,
    NeedsReview,
    Reject,
    Wait,
    decide,
)
from opledger.ledger.evidence import (
    BINDING_MISMATCH,
    STATE_CONFLICT,
    UNBOUND_RESPONSE,
    admit,
    binds,
)

from .histories import DIGEST, KEY, T0, attempt, claim, evidence, grant, operation

S = timedelta(seconds=1)
AFTER = T0 + 60 * S  # past every attempt's 20 s deadline


def keyed(**facts: Any) -> Contract:
    """The sandbox CRM without a lookup, with some facts changed."""
    lookup = facts.pop("lookup", "none")
    return crm_contract(request_timeout=10 * S, max_in_flight=20 * S, lookup=lookup, **facts)


def server_error(n: int = 1, **detail: Any) -> Any:
    return evidence("ambiguous", source="dispatch", attempt_n=n, code="server_error", **detail)


# -- rule 10: a same-key retry is safe only where the key survives what happened ------------


def test_a_provider_that_releases_the_key_on_a_5xx_gets_no_same_key_retry() -> None:
    released = keyed(after_error="key_released")
    decision = decide(released, operation(), [attempt()], [server_error()], grant(), AFTER)
    assert isinstance(decision, NeedsReview) and "releases a key" in decision.reason
    # a timeout is as unreadable as a 5xx: the change may be applied and the key gone
    timeout = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    assert isinstance(
        decide(released, operation(), [attempt()], [timeout], grant(), AFTER), NeedsReview
    )


def test_the_same_5xx_is_retried_where_the_provider_applies_atomically() -> None:
    atomic = keyed(after_error="nothing_applied")
    decision = decide(atomic, operation(), [attempt()], [server_error()], grant(), AFTER)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)


def test_a_provider_that_replays_its_5xx_is_not_asked_again() -> None:
    replaying = keyed(after_error="replayed")
    decision = decide(replaying, operation(), [attempt()], [server_error()], grant(), AFTER)
    assert isinstance(decision, NeedsReview) and "replays it" in decision.reason
    # but a timeout under such a key is safe to retry: the provider answers from the key
    timeout = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    assert isinstance(
        decide(replaying, operation(), [attempt()], [timeout], grant(), AFTER), Dispatch
    )


def test_a_released_key_is_looked_up_and_an_authoritative_absence_allows_the_retry() -> None:
    released = keyed(after_error="key_released", lookup="status_api")
    assert isinstance(
        decide(released, operation(), [attempt()], [server_error()], grant(), AFTER), AskProvider
    )
    absent = evidence("absent", at=AFTER)
    decision = decide(released, operation(), [attempt()], [server_error(), absent], grant(), AFTER)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)


def test_keys_lost_on_restart_are_looked_up_before_any_retry() -> None:
    volatile = keyed(keys_durable=False)
    timeout = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    decision = decide(volatile, operation(), [attempt()], [timeout], grant(), AFTER)
    assert isinstance(decision, NeedsReview) and "restart" in decision.reason
    with_status = keyed(keys_durable=False, lookup="status_api")
    assert isinstance(
        decide(with_status, operation(), [attempt()], [timeout], grant(), AFTER), AskProvider
    )


def test_a_key_is_deduplicated_only_within_the_scope_it_was_sent_to() -> None:
    moved = keyed(scope="account eu")
    timeout = evidence(
        "ambiguous", source="dispatch", attempt_n=1, code="timeout", scope="account us"
    )
    decision = decide(moved, operation(), [attempt()], [timeout], grant(), AFTER)
    assert isinstance(decision, NeedsReview) and "one scope" in decision.reason
    same = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout", scope="account eu")
    assert isinstance(decide(moved, operation(), [attempt()], [same], grant(), AFTER), Dispatch)


def test_a_key_longer_than_the_provider_accepts_is_never_sent() -> None:
    short = keyed(max_key_length=10)
    decision = decide(short, operation(Status.PREPARED, fence=0), [], [], grant(), T0)
    assert isinstance(decision, NeedsReview) and "at most 10" in decision.reason
    # and such a provider is refused when its adapter is registered, before any prepare
    refused = CrmAdapter("http://127.0.0.1:9", account="a", contract=short)
    accepted = CrmAdapter("http://127.0.0.1:9", account="a", contract=keyed(max_key_length=64))
    try:
        with pytest.raises(ValueError, match="at most 10 characters"):
            Registry([refused])
        Registry([accepted])
    finally:
        refused.close()
        accepted.close()


# -- rules 1 and 11: what an attempt's answer may count as ----------------------------------


def test_a_conflicting_state_after_an_earlier_attempt_is_our_own_effect() -> None:
    closed = Rejected(code="case_already_closed", reason="closed", conflicting_state=True)
    second = admit(keyed(), claim(2), closed)
    assert isinstance(second, Ambiguous) and second.code == STATE_CONFLICT
    # on the first attempt nobody but someone else can have closed it: a refusal
    first = admit(keyed(), claim(1), closed)
    assert isinstance(first, Rejected) and first.code == "case_already_closed"


def test_a_refusal_replayed_under_our_key_is_the_first_requests_own_refusal() -> None:
    """The same key sent again got the answer stored for the first request that carried it
    (Stripe's `Idempotent-Replayed: true`): that request was refused, nothing applied."""
    replay = Rejected(
        code="http_400",
        reason="refused",
        conflicting_state=True,
        detail={"status": 400, "replayed": True},
    )
    second = admit(keyed(), claim(2), replay)
    assert isinstance(second, Rejected) and not second.conflicting_state
    assert second.detail["replayed"] is True
    # a fresh refusal (not replayed) after an attempt that may have applied stays ambiguous
    fresh = replay.model_copy(update={"detail": {"status": 400, "replayed": False}})
    stays = admit(keyed(), claim(2), fresh)
    assert isinstance(stays, Ambiguous) and stays.code == STATE_CONFLICT
    # and so does a replay from a provider that does not check the body under a key: it
    # may be someone else's request's answer
    loose = admit(keyed(payload_checked=False), claim(2), replay)
    assert isinstance(loose, Ambiguous) and loose.code == STATE_CONFLICT
    # and so does a replay under an operator's new key: the first request that carried it
    # came after attempts under the old key, one of which may have applied
    renewed = claim(2).model_copy(update={"operation": operation(idempotency_key=f"{KEY}.k2")})
    again = admit(keyed(), renewed, replay)
    assert isinstance(again, Ambiguous) and again.code == STATE_CONFLICT
    # and a replay to a third attempt: the second may have been run afresh by a provider
    # that lost its keys, and refused because of what the first did
    third = admit(keyed(), claim(3), replay)
    assert isinstance(third, Ambiguous) and third.code == STATE_CONFLICT


def test_a_stored_conflicting_state_rejects_only_when_one_attempt_was_sent() -> None:
    contract = keyed(lookup="status_api")
    stored = evidence("rejected", at=AFTER, conflicting_state=True, code="case_already_closed")
    one = decide(contract, operation(), [attempt()], [stored], grant(), AFTER)
    assert one == Reject(evidence_id=stored.id)
    two = [attempt(1), attempt(2, started=T0 + 30 * S)]
    later = AFTER + 30 * S
    assert not isinstance(decide(contract, operation(), two, [stored], grant(), later), Reject)


def test_a_refusal_of_one_attempt_does_not_reject_a_later_one() -> None:
    refusal = evidence("rejected", source="dispatch", attempt_n=1, code="case_not_found")
    two = [attempt(1), attempt(2, started=T0 + 30 * S)]
    decision = decide(keyed(), operation(), two, [refusal], grant(), AFTER + 30 * S)
    assert not isinstance(decision, Reject)


def test_a_response_bound_to_another_body_never_confirms() -> None:
    other = Confirmed(receipt_id="r", binding=Binding(idempotency_key=KEY, payload_digest="b" * 64))
    outcome = admit(keyed(), claim(), other)
    assert isinstance(outcome, Ambiguous) and outcome.code == BINDING_MISMATCH
    # the scope it was sent into stays where the retry risk reads it
    assert outcome.detail["scope"] == keyed().idempotency.scope


def test_a_response_without_the_digest_the_provider_gives_never_confirms() -> None:
    bare = Confirmed(receipt_id="r", binding=Binding(idempotency_key=KEY))
    outcome = admit(keyed(response_binds="key_and_digest"), claim(), bare)
    assert isinstance(outcome, Ambiguous) and outcome.code == UNBOUND_RESPONSE
    assert outcome.detail["scope"] == keyed().idempotency.scope
    assert admit(keyed(response_binds="key"), claim(), bare).kind == "confirmed"


def test_a_replay_from_a_provider_that_does_not_check_payloads_needs_the_digest() -> None:
    replay = Confirmed(
        receipt_id="r", binding=Binding(idempotency_key=KEY), detail={"replayed": True}
    )
    unchecked = keyed(payload_checked=False, response_binds="key")
    outcome = admit(unchecked, claim(), replay)
    assert isinstance(outcome, Ambiguous) and outcome.code == UNBOUND_RESPONSE
    checked = keyed(payload_checked=True, response_binds="key")
    assert admit(checked, claim(), replay).kind == "confirmed"
    bound = replay.model_copy(
        update={"binding": Binding(idempotency_key=KEY, payload_digest=DIGEST)}
    )
    assert admit(unchecked, claim(), bound).kind == "confirmed"


# -- rule 3 and max_attempts: "still executing" and "never sent" ----------------------------


def test_still_executing_does_not_use_up_an_attempt_and_delays_the_next() -> None:
    attempts = [attempt(n, started=T0 + (n - 1) * 30 * S) for n in range(1, 6)]
    busy = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="in_flight", at=T0 + n * 30 * S)
        for n in range(2, 6)
    ]
    first = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    now = T0 + 150 * S + 0.5 * S  # just after the last "in progress" answer
    assert isinstance(decide(keyed(), operation(), attempts, [first, *busy], grant(), now), Wait)
    later = T0 + 200 * S  # four "in progress" answers did not use up the five attempts
    decision = decide(keyed(), operation(), attempts, [first, *busy], grant(), later)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)


def test_attempts_that_sent_nothing_are_no_attempt_in_flight() -> None:
    refused = evidence("ambiguous", source="dispatch", attempt_n=1, code="not_sent")
    no_dedup = crm_contract(keys=False, lookup="none", request_timeout=10 * S)
    # nothing reached the provider, so even one without dedup is sent at once
    decision = decide(no_dedup, operation(), [attempt()], [refused], grant(), T0 + 2 * S)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)
    many = [attempt(n) for n in range(1, 6)]
    all_refused = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="not_sent") for n in range(1, 6)
    ]
    decision = decide(no_dedup, operation(), many, all_refused, grant(), T0 + 2 * S)
    assert isinstance(decision, NeedsReview) and "none of which reached" in decision.reason


# -- consequences come from the same facts --------------------------------------------------


def test_the_review_never_promises_a_protection_the_contract_lacks() -> None:
    released = keyed(after_error="key_released")
    c = consequences(released, operation(), [attempt()], AFTER, [server_error()])
    assert not c.same_key_retry_allowed
    assert "no second" not in c.retry and "releases a key" in c.retry
    atomic = keyed(after_error="nothing_applied")
    c = consequences(atomic, operation(), [attempt()], AFTER, [server_error()])
    assert c.same_key_retry_allowed and "no second change to the case is made" in c.retry
    assert "undoing a change" in c.cancel
    # the contract, not the action's name, says what one effect is called
    mail = keyed().model_copy(update={"effect": "email"})
    email = consequences(mail, operation(action="crm.close_case.v1"), [attempt()], AFTER)
    assert "undoing an email" in email.cancel


def test_every_attempt_records_the_scope_it_was_sent_into() -> None:
    lost = Ambiguous(code="timeout", reason="slow")
    assert admit(keyed(scope="account eu"), claim(), lost).detail["scope"] == "account eu"


def test_a_refusal_after_an_unprotected_earlier_attempt_is_no_rejection() -> None:
    """Attempt 1 may have applied; attempt 2 (a new key, or a key that did not protect it)
    is refused: the refusal speaks for attempt 2 only."""
    two_keys = [attempt(1), attempt(2, started=T0 + 30 * S, key=f"{KEY}.k2")]
    lost = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    refusal = evidence(
        "rejected", source="dispatch", attempt_n=2, key=f"{KEY}.k2", code="case_not_found"
    )
    op = operation(idempotency_key=f"{KEY}.k2")
    later = AFTER + 30 * S
    assert not isinstance(decide(keyed(), op, two_keys, [lost, refusal], grant(), later), Reject)
    same_key = [attempt(1), attempt(2, started=T0 + 30 * S)]
    refused = evidence("rejected", source="dispatch", attempt_n=2, code="case_not_found")
    protected = decide(keyed(), operation(), same_key, [lost, refused], grant(), later)
    assert protected == Reject(evidence_id=refused.id)  # the key would have answered for 1
    released = keyed(after_error="key_released")
    decision = decide(released, operation(), same_key, [lost, refused], grant(), later)
    assert not isinstance(decision, Reject)


def test_still_executing_is_read_only_from_a_provider_that_says_so() -> None:
    busy = evidence("ambiguous", source="dispatch", attempt_n=2, code="in_flight", at=AFTER)
    first = evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")
    attempts = [attempt(1), attempt(2, started=AFTER - S)]
    unchecked = keyed(concurrent="unchecked")
    # an "in progress" answer the contract does not promise is an attempt like any other:
    # its own deadline holds the next one back, and it counts
    decision = decide(unchecked, operation(), attempts, [first, busy], grant(), AFTER + 2 * S)
    assert isinstance(decision, Wait) and decision.until == AFTER - S + 20 * S


def test_a_status_api_without_deduplication_needs_the_digest_to_confirm() -> None:
    """A provider without keys that answers a status query by our reference keeps whatever
    body was sent under it: another client's request under our reference is not ours."""
    keyless = crm_contract(keys=False, request_timeout=10 * S, max_in_flight=20 * S)
    assert keyless.idempotency.kind == "none" and keyless.lookup.kind == "status_api"
    op, keys = operation(), frozenset({KEY})
    assert not binds(evidence("confirmed", key=KEY), op, keys, keyless)
    assert binds(evidence("confirmed", key=KEY, digest=DIGEST), op, keys, keyless)
    foreign = evidence("confirmed", key=KEY, digest="b" * 64)
    assert not binds(foreign, op, keys, keyless)


def test_a_search_finding_our_key_at_an_unchecked_key_store_needs_the_digest() -> None:
    """A deduplicating provider that stores any body under a used key, searched by that key:
    the hit may be someone else's request under our key unless it names our body."""
    unchecked = crm_contract(
        lookup="search", payload_checked=False, request_timeout=10 * S, max_in_flight=20 * S
    )
    op, keys = operation(), frozenset({KEY})
    assert not binds(evidence("confirmed", key=KEY), op, keys, unchecked)
    assert binds(evidence("confirmed", key=KEY, digest=DIGEST), op, keys, unchecked)
    checked = unchecked.model_copy(
        update={"idempotency": unchecked.idempotency.model_copy(update={"payload_checked": True})}
    )
    assert binds(evidence("confirmed", key=KEY), op, keys, checked)


# -- rule 6: a search that lags, behind a read-after-write list ------------------------------


def test_a_read_after_write_lookup_is_asked_at_the_deadline_and_its_absence_waits() -> None:
    """Stripe's lookup reads its lists first (read-after-write): a lost answer is looked up
    as soon as no attempt can be in flight, not a search lag later; finding nothing there
    still proves nothing until the search has caught up."""
    stripe = stripe_contract(
        request_timeout=10 * S, max_in_flight=20 * S, lookup_lag=60 * S
    ).model_copy(update={"max_attempts": 5})
    assert stripe.lookup.read_after_write
    op, sent = operation(), [attempt()]
    lost = [evidence("ambiguous", source="dispatch", attempt_n=1, code="timeout")]
    right_after = T0 + 25 * S
    assert decide(stripe, op, sent, lost, grant(), right_after) == AskProvider()
    # found nothing yet: held until the search could show it, then asked again
    nothing = evidence("inconclusive", at=right_after, source="lookup", hits=0)
    held = decide(stripe, op, sent, [*lost, nothing], grant(), right_after + S)
    assert isinstance(held, HoldUnknown) and held.next_check > right_after + 50 * S
    # a search-only provider waits for its lag before the first lookup
    search_only = stripe.model_copy(
        update={"lookup": stripe.lookup.model_copy(update={"read_after_write": False})}
    )
    waiting = decide(search_only, op, sent, lost, grant(), right_after)
    assert isinstance(waiting, HoldUnknown) and "search to catch up" in waiting.reason
