"""One hand-written case per rule of the retry decision (the numbered rules of
docs/rules.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from opledger.adapters.crm import crm_contract
from opledger.adapters.email import email_contract
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import Status
from opledger.ledger.contract import Contract
from opledger.ledger.decide import (
    AskProvider,
    Confirm,
    Dispatch,
    HoldUnknown,
    NeedsReview,
    Reject,
    Wait,
    decide,
)
from opledger.ledger.models import Evidence

from .histories import DIGEST, KEY, T0, attempt, evidence, grant, operation

S = timedelta(seconds=1)
KEYED_STATUS = crm_contract(request_timeout=10 * S, max_in_flight=20 * S)
KEYED_NO_LOOKUP = crm_contract(request_timeout=10 * S, max_in_flight=20 * S, lookup="none")
SEARCH_ONLY = email_contract(
    keys=False, request_timeout=10 * S, max_in_flight=20 * S, search_lag=30 * S
)
NO_DEDUP = smtp_contract(request_timeout=10 * S)


def test_rule_1_confirm_only_on_evidence_binding_this_operation() -> None:
    op, attempts = operation(), [attempt()]
    bound = evidence("confirmed", key=KEY, target="case-318", at=T0 + 30 * S)
    assert decide(KEYED_STATUS, op, attempts, [bound], grant(), T0 + 31 * S) == Confirm(
        evidence_id=bound.id
    )
    # the case is closed, but nothing says it was our request: inconclusive
    state_match = evidence("confirmed", key=None, target="case-318", at=T0 + 30 * S)
    assert not isinstance(
        decide(KEYED_STATUS, op, attempts, [state_match], grant(), T0 + 31 * S), Confirm
    )
    # our key but another target or payload: contradicts, so it confirms nothing
    for wrong in (
        evidence("confirmed", key=KEY, target="case-999", at=T0 + 30 * S),
        evidence("confirmed", key=KEY, digest="b" * 64, at=T0 + 30 * S),
    ):
        assert not isinstance(
            decide(KEYED_STATUS, op, attempts, [wrong], grant(), T0 + 31 * S), Confirm
        )


def test_rule_1_a_receipt_id_we_hold_binds_too() -> None:
    op = operation(provider_result_id="case-318@v7")
    ev = evidence("confirmed", key=None, receipt="case-318@v7", at=T0)
    assert decide(KEYED_STATUS, op, [attempt()], [ev], grant(), T0 + S) == Confirm(
        evidence_id=ev.id
    )


def test_rule_2_reject_only_on_a_definitive_refusal() -> None:
    op, attempts = operation(), [attempt()]
    refusal = evidence("rejected", source="dispatch", code="case_not_found", attempt_n=1)
    assert decide(KEYED_STATUS, op, attempts, [refusal], grant(), T0 + S) == Reject(
        evidence_id=refusal.id
    )
    for code in ("timeout", "connection_lost", "server_error"):
        ambiguous = evidence("ambiguous", source="dispatch", code=code)
        for now in (T0 + S, T0 + 60 * S):
            assert not isinstance(
                decide(KEYED_STATUS, op, attempts, [ambiguous], grant(), now), Reject
            )


@pytest.mark.parametrize(
    "contract",
    [KEYED_STATUS, KEYED_NO_LOOKUP, SEARCH_ONLY, NO_DEDUP],
    ids=["status_api", "keyed", "search", "none"],
)
def test_rule_3_nothing_is_sent_while_an_attempt_may_be_in_flight(contract: Contract) -> None:
    op, attempts = operation(), [attempt(in_flight=20 * S)]
    decision = decide(contract, op, attempts, [], grant(), T0 + 5 * S)
    assert isinstance(decision, Wait | AskProvider)
    if isinstance(decision, Wait):
        assert decision.until == T0 + 20 * S


def test_rule_3_a_pending_status_after_the_deadline_still_blocks_a_retry() -> None:
    op, attempts = operation(), [attempt(in_flight=20 * S)]
    pending = evidence("pending", at=T0 + 21 * S)
    decision = decide(KEYED_STATUS, op, attempts, [pending], grant(), T0 + 22 * S)
    assert isinstance(decision, HoldUnknown)


def test_rule_4_same_key_only_inside_the_retention_window() -> None:
    contract = KEYED_NO_LOOKUP
    op, attempts = operation(), [attempt()]
    inside = decide(contract, op, attempts, [], grant(), T0 + timedelta(hours=1))
    assert inside == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)
    near_end = T0 + timedelta(hours=24) - contract.retention_margin
    assert isinstance(decide(contract, op, attempts, [], grant(), near_end), NeedsReview)
    assert isinstance(
        decide(contract, op, attempts, [], grant(), T0 + timedelta(days=3)), NeedsReview
    )


def test_rule_5_a_replayed_stored_error_is_not_retried() -> None:
    op = operation()
    attempts = [attempt(1), attempt(2, started=T0 + 30 * S)]
    replayed = evidence("ambiguous", source="dispatch", code="http_503", replayed=True)
    # even a provider that does not promise to replay errors: a replay is no new information
    forgetful = KEYED_NO_LOOKUP.model_copy(
        update={
            "idempotency": KEYED_NO_LOOKUP.idempotency.model_copy(
                update={"after_error": "nothing_applied"}
            )
        }
    )
    assert isinstance(
        decide(forgetful, op, attempts, [replayed], grant(), T0 + 90 * S), NeedsReview
    )
    fresh = evidence("ambiguous", source="dispatch", code="http_503", replayed=False)
    assert isinstance(decide(forgetful, op, attempts, [fresh], grant(), T0 + 90 * S), Dispatch)
    # a provider that stores errors will replay the first 500 too
    first = evidence("ambiguous", source="dispatch", code="server_error", replayed=False)
    decision = decide(KEYED_NO_LOOKUP, op, [attempt()], [first], grant(), T0 + 90 * S)
    assert isinstance(decision, NeedsReview)


def test_rule_6_search_absence_proves_nothing_but_status_absence_does() -> None:
    op, attempts = operation(action="email.send.v1"), [attempt()]
    # search: wait out the lag, look, and with nothing found and no dedup, a person decides
    assert isinstance(decide(SEARCH_ONLY, op, attempts, [], grant(), T0 + 25 * S), HoldUnknown)
    assert isinstance(decide(SEARCH_ONLY, op, attempts, [], grant(), T0 + 55 * S), AskProvider)
    nothing = evidence("inconclusive", at=T0 + 55 * S)
    assert isinstance(
        decide(SEARCH_ONLY, op, attempts, [nothing], grant(), T0 + 56 * S), NeedsReview
    )
    # status API: "no such request" after the deadline is proof: retry with the same key
    absent = evidence("absent", at=T0 + 21 * S)
    assert decide(KEYED_STATUS, op, attempts, [absent], grant(), T0 + 22 * S) == Dispatch(
        idempotency_key=KEY, payload_digest=DIGEST
    )
    # ... but not when it was asked before the deadline
    early_absent = evidence("absent", at=T0 + 5 * S)
    assert not isinstance(
        decide(KEYED_STATUS, op, attempts, [early_absent], grant(), T0 + 22 * S), Dispatch
    )


def test_rule_7_no_dedup_and_no_decisive_lookup_goes_to_review() -> None:
    op = operation(action="email.smtp_send.v1")
    decision = decide(NO_DEDUP, op, [attempt(in_flight=600 * S)], [], grant(), T0 + 601 * S)
    assert isinstance(decision, NeedsReview)


def test_rule_8_revoked_authority_stops_writes_not_lookups() -> None:
    op, attempts = operation(), [attempt()]
    assert isinstance(
        decide(KEYED_STATUS, op, attempts, [], grant(revoked=True), T0 + 30 * S), AskProvider
    )
    absent = evidence("absent", at=T0 + 21 * S)
    decision = decide(KEYED_STATUS, op, attempts, [absent], grant(revoked=True), T0 + 30 * S)
    assert isinstance(decision, NeedsReview)
    assert isinstance(decide(KEYED_NO_LOOKUP, op, attempts, [], None, T0 + 30 * S), NeedsReview)


def test_a_key_used_with_another_payload_goes_to_review() -> None:
    mismatch = evidence("ambiguous", source="dispatch", code="idempotency_mismatch")
    decision = decide(KEYED_NO_LOOKUP, operation(), [attempt()], [mismatch], grant(), T0 + 60 * S)
    assert isinstance(decision, NeedsReview)


def test_a_poisoned_key_needs_a_person() -> None:
    from opledger.adapters.presets import SHOPIFY

    poisoned = evidence("ambiguous", source="dispatch", code="key_poisoned")
    decision = decide(SHOPIFY, operation(), [attempt()], [poisoned], grant(), T0 + 600 * S)
    assert isinstance(decision, NeedsReview)


def test_attempts_are_bounded() -> None:
    attempts = [attempt(n, started=T0 + n * 30 * S) for n in range(1, 6)]
    decision = decide(KEYED_NO_LOOKUP, operation(), attempts, [], grant(), T0 + 400 * S)
    assert isinstance(decision, NeedsReview)


def test_a_prepared_operation_is_dispatched_and_a_final_one_refused() -> None:
    prepared = operation(Status.PREPARED, fence=0)
    assert decide(KEYED_STATUS, prepared, [], [], grant(), T0) == Dispatch(
        idempotency_key=KEY, payload_digest=DIGEST
    )
    with pytest.raises(ValueError):
        decide(KEYED_STATUS, operation(Status.CONFIRMED), [attempt()], [], grant(), T0)


def test_the_review_policy_hands_it_to_a_person_sooner_than_the_contract() -> None:
    """`ReviewPolicy`: after `after_attempts` attempts, or while it still waits `after`
    since its first attempt (unless an operator asked for this retry)."""
    from opledger.ledger.decide import ReviewPolicy

    op, first = operation(), attempt(in_flight=20 * S)
    # in flight: it waits; the same wait past the policy's age goes to a person
    assert isinstance(decide(KEYED_NO_LOOKUP, op, [first], [], grant(), T0 + 10 * S), Wait)
    policy = ReviewPolicy(after=5 * S)
    late = decide(KEYED_NO_LOOKUP, op, [first], [], grant(), T0 + 10 * S, policy)
    assert late == NeedsReview(reason="still unknown 5 s after the first attempt")
    at_the_age = decide(KEYED_NO_LOOKUP, op, [first], [], grant(), T0 + 5 * S, policy)
    assert isinstance(at_the_age, Wait)  # the age is the last instant it still waits
    retry = operation(operator_retry_by="alice")
    assert isinstance(
        decide(KEYED_NO_LOOKUP, retry, [first], [], grant(), T0 + 10 * S, policy), Wait
    )
    # past its deadline with a same-key retry allowed: sent again, unless the policy
    # says one attempt is enough
    after = T0 + 30 * S
    assert isinstance(decide(KEYED_NO_LOOKUP, op, [first], [], grant(), after), Dispatch)
    enough = decide(
        KEYED_NO_LOOKUP, op, [first], [], grant(), after, ReviewPolicy(after_attempts=1)
    )
    assert isinstance(enough, NeedsReview) and "1 attempts" in enough.reason


# -- a provider's pressure: "not now" answers and refused connections ------------------------

THROTTLE_DOCUMENTED = KEYED_STATUS.model_copy(
    update={"limits": KEYED_STATUS.limits.model_copy(update={"throttle_applies_nothing": True})}
)


def _throttled(n: int, at_s: int, retry_after_s: float | None = None) -> Evidence:
    detail: dict[str, Any] = {"code": "throttled", "status": 429}
    if retry_after_s is not None:
        detail["retry_after_s"] = retry_after_s
    return evidence("ambiguous", source="dispatch", attempt_n=n, at=T0 + at_s * S, **detail)


def test_not_now_waits_as_long_as_the_provider_asked_and_never_counts() -> None:
    op = operation()
    attempts = [attempt(n, started=T0 + (n - 1) * 100 * S) for n in range(1, 7)]
    answers = [_throttled(n, (n - 1) * 100 + 1, retry_after_s=30) for n in range(1, 7)]
    # six "not now" answers, the last at 501 s asking for 30 s: wait until 531 s exactly
    decision = decide(THROTTLE_DOCUMENTED, op, attempts, answers, grant(), T0 + 520 * S)
    assert decision == Wait(until=T0 + 531 * S)
    # then sent again: six attempts, none of which counts toward the five that ask a person
    decision = decide(THROTTLE_DOCUMENTED, op, attempts, answers, grant(), T0 + 531 * S)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)


def test_not_now_without_retry_after_waits_the_contract_default_and_a_huge_one_is_capped() -> None:
    op, attempts = operation(), [attempt()]
    bare = _throttled(1, 1)
    limits = THROTTLE_DOCUMENTED.limits
    decision = decide(THROTTLE_DOCUMENTED, op, attempts, [bare], grant(), T0 + 1 * S)
    assert decision == Wait(until=T0 + 1 * S + limits.retry_after_default)
    for too_long in (86400, 1e300, float("inf")):  # beyond what a timedelta holds, too
        huge = _throttled(1, 1, retry_after_s=too_long)
        decision = decide(THROTTLE_DOCUMENTED, op, attempts, [huge], grant(), T0 + 2 * S)
        assert decision == Wait(until=T0 + 1 * S + limits.retry_after_max)


def test_an_undocumented_not_now_may_have_applied_so_the_other_rules_still_hold() -> None:
    # a provider without dedup that does not document its 429s: the attempt may have run,
    # so after the wait it asked for a person decides (rule 7), as after any other answer
    no_dedup = crm_contract(keys=False, lookup="none", request_timeout=10 * S)
    no_dedup = no_dedup.model_copy(
        update={"limits": no_dedup.limits.model_copy(update={"throttle_applies_nothing": False})}
    )
    op, attempts = operation(), [attempt()]
    answer = _throttled(1, 1, retry_after_s=5)
    late = attempts[0].deadline_at + S
    assert isinstance(decide(no_dedup, op, attempts, [answer], grant(), late), NeedsReview)


def test_refused_connections_never_send_an_operation_to_a_person() -> None:
    # the provider's breaker holds these back; the operation itself is never at fault
    op = operation()
    attempts = [attempt(n) for n in range(1, 9)]
    refused = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="not_sent", why="no_connection")
        for n in range(1, 9)
    ]
    decision = decide(NO_DEDUP, op, attempts, refused, grant(), T0 + 2 * S)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)
    # while a send window that passed five times is our own slowness: a person looks
    late = [
        evidence("ambiguous", source="dispatch", attempt_n=n, code="not_sent", why="window_passed")
        for n in range(1, 6)
    ]
    decision = decide(NO_DEDUP, op, attempts[:5], late, grant(), T0 + 2 * S)
    assert isinstance(decision, NeedsReview) and "none of which reached" in decision.reason


def test_undocumented_not_now_answers_never_count_toward_the_attempts_either() -> None:
    # a keyed provider whose key protects a retry, not documenting its 429s: each "not now"
    # may have applied (so every other rule reads it), yet six of them ask no person
    keyed = KEYED_NO_LOOKUP.model_copy(
        update={
            "limits": KEYED_NO_LOOKUP.limits.model_copy(update={"throttle_applies_nothing": False})
        }
    )
    op = operation()
    attempts = [attempt(n, started=T0 + (n - 1) * 100 * S) for n in range(1, 7)]
    answers = [_throttled(n, (n - 1) * 100 + 1, retry_after_s=5) for n in range(1, 7)]
    later = attempts[-1].deadline_at + S
    decision = decide(keyed, op, attempts, answers, grant(), later)
    assert decision == Dispatch(idempotency_key=KEY, payload_digest=DIGEST)
