"""The retry decision at the edges of its rules (what `make mutate` asks of decide.py).

Each test states a numbered rule of the retry decision (docs/rules.md), or what a helper's docstring
promises, at the exact point where it switches: a deadline is the first instant nothing is in
flight, a limit is the last value allowed, the latest answer is the one that counts. NeedsReview
reasons are read by a person, so where a test checks one it checks that the reason names the cause.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from opledger.adapters.crm import crm_contract
from opledger.adapters.email import email_contract
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import Ambiguous, Binding, Confirmed, Rejected, Status
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
from opledger.ledger.evidence import (
    BINDING_MISMATCH,
    STATE_CONFLICT,
    UNBOUND_RESPONSE,
    admit,
    attempt_codes,
    binding_clashes,
    binds,
)
from opledger.ledger.risk import human, retention_risk, same_key_retry_risk

from .histories import DIGEST, KEY, OP_ID, T0, attempt, claim, evidence, grant, operation

S = timedelta(seconds=1)
KEYS = frozenset({KEY})
SEND = Dispatch(idempotency_key=KEY, payload_digest=DIGEST)
OTHER_DIGEST = "b" * 64


def keyed(**facts: Any) -> Contract:
    """The sandbox CRM (keys replay errors, durable, payload checked, 409 while executing,
    responses bind key and digest), 20 s in flight, no lookup unless asked."""
    lookup = facts.pop("lookup", "none")
    return crm_contract(request_timeout=10 * S, max_in_flight=20 * S, lookup=lookup, **facts)


STATUS_API = keyed(lookup="status_api")  # lookup interval 5 s
NO_DEDUP = smtp_contract(request_timeout=10 * S, max_in_flight=20 * S)
NO_DEDUP_STATUS = crm_contract(
    keys=False, lookup="status_api", request_timeout=10 * S, max_in_flight=20 * S
)
SEARCH_ONLY = email_contract(
    keys=False, request_timeout=10 * S, max_in_flight=20 * S, search_lag=30 * S
)
AFTER = T0 + 60 * S  # past a first attempt's 20 s deadline


def dispatched(code: str, n: int = 1, **detail: Any) -> Any:
    return evidence("ambiguous", source="dispatch", attempt_n=n, code=code, **detail)


# -- how durations are shown to a person -----------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0 s"),
        (59, "59 s"),
        (60, "1 min"),
        (119, "1 min"),
        (3599, "59 min"),
        (3600, "1 h"),
        (31 * 3600, "31 h"),
        (2 * 86400 - 1, "47 h"),
        (2 * 86400, "2 d"),
        (3 * 86400 + 7200, "3 d"),
    ],
)
def test_a_duration_is_shown_in_whole_units_of_the_largest_that_reads_well(
    seconds: int, shown: str
) -> None:
    assert human(timedelta(seconds=seconds)) == shown


# -- rule 1: what a receipt binds -------------------------------------------------------------


def test_a_receipt_clashes_on_exactly_the_fields_it_names_differently() -> None:
    op = operation()
    assert binding_clashes(Binding(), op, KEY) == []
    ours = Binding(idempotency_key=KEY, target="case-318", payload_digest=DIGEST)
    assert binding_clashes(ours, op, KEY) == []
    assert binding_clashes(Binding(idempotency_key="someone-else"), op, KEY) == ["key"]
    assert binding_clashes(Binding(idempotency_key=OP_ID), op, KEY) == ["key"]  # id, not key
    assert binding_clashes(Binding(target="case-9"), op, KEY) == ["target"]
    assert binding_clashes(Binding(payload_digest=OTHER_DIGEST), op, KEY) == ["payload_digest"]
    every = Binding(idempotency_key="someone-else", target="case-9", payload_digest=OTHER_DIGEST)
    assert binding_clashes(every, op, KEY) == ["key", "target", "payload_digest"]
    assert (
        binding_clashes(Binding(idempotency_key="someone-else"), op, None) == []
    )  # no key of ours yet


def test_a_receipt_for_another_key_never_confirms_and_keeps_the_receipt_as_json() -> None:
    received = datetime(2026, 1, 1, 12, 0, 5, tzinfo=UTC)
    foreign = Confirmed(
        receipt_id="r1",
        binding=Binding(idempotency_key="someone-else"),
        detail={"received": received, "versions": (6, 7)},
    )
    for contract in (keyed(), None):  # the ledger's own API checks the binding too
        outcome = admit(contract, claim(), foreign)
        assert isinstance(outcome, Ambiguous) and outcome.code == BINDING_MISMATCH
        assert outcome.reason.endswith("binds another key)")
        receipt = outcome.detail["receipt"]  # stored as JSON with the evidence
        assert json.loads(json.dumps(receipt)) == receipt
        assert (
            receipt["receipt_id"] == "r1"
            and receipt["binding"]["idempotency_key"] == "someone-else"
        )
        assert datetime.fromisoformat(receipt["detail"]["received"]) == received
        assert receipt["detail"]["versions"] == [6, 7]


def test_without_a_contract_only_the_binding_is_checked_and_no_scope_recorded() -> None:
    bare = Confirmed(receipt_id="r", binding=Binding())
    assert admit(None, claim(), bare) == bare
    lost = Ambiguous(code="timeout", reason="slow")
    assert admit(None, claim(), lost) == lost
    assert "scope" in admit(keyed(), claim(), lost).detail


def test_a_response_binds_what_the_contract_says_the_provider_gives() -> None:
    bare = Confirmed(receipt_id="r", binding=Binding(), detail={"at": T0})
    keyed_only = Confirmed(receipt_id="r", binding=Binding(idempotency_key=KEY))
    assert admit(keyed(response_binds="nothing"), claim(), bare).kind == "confirmed"
    for binds_what in ("key", "key_and_digest"):
        outcome = admit(keyed(response_binds=binds_what), claim(), bare)
        assert isinstance(outcome, Ambiguous) and outcome.code == UNBOUND_RESPONSE
        assert "does not name our key" in outcome.reason
        receipt = json.loads(json.dumps(outcome.detail["receipt"]))
        assert datetime.fromisoformat(receipt["detail"]["at"]) == T0
    outcome = admit(keyed(response_binds="key_and_digest"), claim(), keyed_only)
    assert isinstance(outcome, Ambiguous) and outcome.code == UNBOUND_RESPONSE
    assert "request body it executed, although the provider gives it" in outcome.reason
    replay = keyed_only.model_copy(update={"detail": {"replayed": True}})
    outcome = admit(keyed(response_binds="key", payload_checked=False), claim(), replay)
    assert isinstance(outcome, Ambiguous) and outcome.code == UNBOUND_RESPONSE
    assert "does not check the payload may answer someone else's request" in outcome.reason


def test_a_conflicting_state_after_an_earlier_attempt_keeps_what_the_provider_said() -> None:
    closed = Rejected(
        code="case_already_closed", reason="closed", conflicting_state=True, detail={"status": 409}
    )
    outcome = admit(keyed(), claim(2), closed)
    assert isinstance(outcome, Ambiguous) and outcome.code == STATE_CONFLICT
    assert outcome.detail["status"] == 409
    assert outcome.detail["refusal"] == "case_already_closed"
    assert outcome.detail["conflicting_state"] is True
    assert "this is as likely our own effect as a refusal" in outcome.reason


def test_evidence_binds_only_with_our_key_or_receipt_and_what_the_contract_requires() -> None:
    op = operation(provider_result_id="case-318@v7")
    # another key binds nothing, with or without a contract
    foreign = evidence("confirmed", key="someone-else")
    assert not binds(foreign, op, KEYS) and not binds(foreign, op, KEYS, STATUS_API)
    # a dispatch response must carry what the provider's responses bind
    by_receipt = evidence("confirmed", source="dispatch", key=None, receipt="case-318@v7")
    assert binds(by_receipt, op, KEYS, keyed(response_binds="nothing"))
    assert not binds(by_receipt, op, KEYS, keyed(response_binds="key"))
    with_key = evidence("confirmed", source="dispatch", key=KEY)
    assert binds(with_key, op, KEYS, keyed(response_binds="key"))
    # a replay from a provider that does not check the payload must name our body
    unchecked = keyed(response_binds="key", payload_checked=False)
    replayed = evidence("confirmed", source="dispatch", key=KEY, replayed=True)
    assert not binds(replayed, op, KEYS, unchecked)
    assert binds(with_key, op, KEYS, unchecked)
    replayed_ours = evidence("confirmed", source="dispatch", key=KEY, digest=DIGEST, replayed=True)
    assert binds(replayed_ours, op, KEYS, unchecked)


def test_a_lookup_by_key_confirms_only_where_the_key_tells_our_body_from_others() -> None:
    op = operation()
    found = evidence("confirmed", key=KEY)
    assert binds(found, op, KEYS)  # no contract: the binding alone
    assert binds(found, op, KEYS, keyed(lookup="status_api", payload_checked=True))
    unchecked = keyed(lookup="status_api", payload_checked=False)
    assert not binds(found, op, KEYS, unchecked)
    assert binds(evidence("confirmed", key=KEY, digest=DIGEST), op, KEYS, unchecked)
    assert binds(evidence("confirmed", key=KEY, digest=DIGEST), op, KEYS, NO_DEDUP_STATUS)
    # a refusal by our key speaks for our key, whatever the body
    assert binds(evidence("rejected", key=KEY), op, KEYS, unchecked)


def test_rule_1_through_decide_a_lookup_by_key_needs_the_digest_where_payloads_go_unchecked() -> (
    None
):
    unchecked = keyed(lookup="status_api", payload_checked=False)
    found = evidence("confirmed", key=KEY, at=T0 + 21 * S)
    decision = decide(unchecked, operation(), [attempt()], [found], grant(), T0 + 22 * S)
    assert not isinstance(decision, Confirm)
    ours = evidence("confirmed", key=KEY, digest=DIGEST, at=T0 + 21 * S)
    decision = decide(unchecked, operation(), [attempt()], [ours], grant(), T0 + 22 * S)
    assert decision == Confirm(evidence_id=ours.id)


# -- which attempts count ---------------------------------------------------------------------


def test_an_attempts_code_comes_from_its_own_dispatch_evidence_only() -> None:
    history = [
        dispatched("timeout", n=1),
        evidence("inconclusive", attempt_n=2, code="not_sent"),  # a lookup, not the attempt
        evidence("ambiguous", source="dispatch", attempt_n=None, code="not_sent"),
    ]
    assert attempt_codes(history) == {1: "timeout"}


# -- rule 4 and rule 10: when the key protects a same-key retry ---------------------------------


def test_no_retention_risk_without_keys_or_before_the_key_was_used() -> None:
    assert retention_risk(keyed(), operation(), [], [], AFTER) is None
    assert retention_risk(NO_DEDUP, operation(), [attempt()], [], AFTER) is None
    # an operator's new key was never sent: the provider cannot have forgotten it
    renewed = operation(idempotency_key=f"{KEY}.k2")
    assert retention_risk(keyed(), renewed, [attempt()], [], T0 + timedelta(days=3)) is None
    assert same_key_retry_risk(keyed(), renewed, [attempt()], [], T0 + timedelta(days=3)) is None


def test_a_provider_without_keys_gives_a_retry_no_protection() -> None:
    risk = same_key_retry_risk(NO_DEDUP, operation(), [attempt()], [], AFTER)
    assert risk is not None and "does not deduplicate: a retry could repeat the effect" in risk


def test_a_released_key_protects_only_where_every_outcome_was_read() -> None:
    released = keyed(after_error="key_released")
    for read in ("confirmed", "rejected"):
        assert (
            same_key_retry_risk(released, operation(), [attempt(outcome=read)], [], AFTER) is None
        )
    for unread in ("ambiguous", None):
        risk = same_key_retry_risk(released, operation(), [attempt(outcome=unread)], [], AFTER)
        assert risk is not None
        assert "possibly after applying the change, and an earlier attempt's outcome" in risk


def test_a_scope_change_names_the_scopes_on_both_sides() -> None:
    history = [
        dispatched("timeout", n=1, scope="account us"),
        dispatched("timeout", n=2, scope="account eu"),
    ]
    attempts = [attempt(1), attempt(2, started=T0 + 30 * S)]
    risk = same_key_retry_risk(keyed(scope="account ap"), operation(), attempts, history, AFTER)
    assert risk is not None
    assert "account eu, account us" in risk and "would go to account ap" in risk
    unnamed = same_key_retry_risk(keyed(scope=""), operation(), attempts, history, AFTER)
    assert unnamed is not None and "would go to another scope;" in unnamed


# -- rule 3: the deadline is the first instant nothing is in flight ----------------------------


def test_a_retry_may_start_exactly_at_the_deadline_not_before() -> None:
    deadline = T0 + 20 * S
    early = decide(
        keyed(), operation(), [attempt()], [], grant(), deadline - timedelta(microseconds=1)
    )
    assert early == Wait(until=deadline)
    assert decide(keyed(), operation(), [attempt()], [], grant(), deadline) == SEND


def test_a_still_executing_refusal_holds_back_an_unsent_operation_for_one_interval() -> None:
    busy = dispatched("in_flight", n=1, at=T0 + S)  # attempt 1 was refused: another runs
    held_until = T0 + S + 5 * S  # one lookup interval
    decision = decide(keyed(), operation(), [attempt()], [busy], grant(), T0 + 3 * S)
    assert decision == Wait(until=held_until)
    assert decide(keyed(), operation(), [attempt()], [busy], grant(), held_until) == SEND


def test_while_in_flight_a_status_api_is_asked_once_per_interval() -> None:
    lost = dispatched("timeout", at=T0 + 10 * S)  # recorded when attempt 1 timed out
    deadline = T0 + 20 * S
    assert (
        decide(STATUS_API, operation(), [attempt()], [lost], grant(), T0 + 12 * S) == AskProvider()
    )
    asked = evidence("pending", at=T0 + 10 * S)
    history = [lost, asked]
    decision = decide(STATUS_API, operation(), [attempt()], history, grant(), T0 + 12 * S)
    assert decision == Wait(until=deadline)
    # one full interval after the last lookup, ask again
    assert (
        decide(STATUS_API, operation(), [attempt()], history, grant(), T0 + 15 * S) == AskProvider()
    )


# -- rules 2, 6 and the status API: the latest answer after the deadline counts ---------------


def test_the_latest_lookup_after_the_deadline_is_the_one_that_counts() -> None:
    pending = evidence("pending", at=T0 + 21 * S)
    absent = evidence("absent", at=T0 + 27 * S)
    now = T0 + 28 * S
    for history in ([pending, absent], [absent, pending]):
        assert decide(STATUS_API, operation(), [attempt()], history, grant(), now) == SEND
    early_absent = evidence("absent", at=T0 + 21 * S)
    late_pending = evidence("pending", at=T0 + 27 * S)
    for history in ([early_absent, late_pending], [late_pending, early_absent]):
        decision = decide(STATUS_API, operation(), [attempt()], history, grant(), now)
        assert isinstance(decision, HoldUnknown)
        assert decision.next_check == T0 + 32 * S  # one interval after the last lookup


def test_a_pending_answer_is_asked_again_exactly_one_interval_later() -> None:
    pending = evidence("pending", at=T0 + 21 * S)
    decision = decide(STATUS_API, operation(), [attempt()], [pending], grant(), T0 + 25 * S)
    assert isinstance(decision, HoldUnknown) and decision.next_check == T0 + 26 * S
    assert "still in progress" in decision.reason
    assert (
        decide(STATUS_API, operation(), [attempt()], [pending], grant(), T0 + 26 * S)
        == AskProvider()
    )


def test_an_absence_answered_at_the_deadline_itself_is_proof() -> None:
    at_deadline = evidence("absent", at=T0 + 20 * S)
    decision = decide(STATUS_API, operation(), [attempt()], [at_deadline], grant(), T0 + 21 * S)
    assert decision == SEND


def test_only_an_absence_of_our_own_key_is_proof() -> None:
    now = T0 + 22 * S
    for no_proof in (
        evidence("absent", key="someone-else", at=T0 + 21 * S),
        evidence("inconclusive", key=KEY, at=T0 + 21 * S),
    ):
        decision = decide(STATUS_API, operation(), [attempt()], [no_proof], grant(), now)
        assert isinstance(decision, HoldUnknown)
        assert "the status API gave no binding answer" in decision.reason


def test_an_inconclusive_status_api_is_asked_again_then_a_person_decides() -> None:
    vague = evidence("inconclusive", at=T0 + 21 * S)
    soon = decide(STATUS_API, operation(), [attempt()], [vague], grant(), T0 + 22 * S)
    assert isinstance(soon, HoldUnknown) and soon.next_check == T0 + 27 * S
    assert "the status API gave no binding answer" in soon.reason
    later = decide(
        STATUS_API, operation(), [attempt()], [vague], grant(), T0 + 20 * S + 10 * 60 * S
    )
    assert (
        isinstance(later, NeedsReview) and "the status API gave no binding answer" in later.reason
    )


def test_an_authoritative_absence_allows_a_retry_even_without_keys() -> None:
    absent = evidence("absent", at=T0 + 21 * S)
    decision = decide(NO_DEDUP_STATUS, operation(), [attempt()], [absent], grant(), T0 + 22 * S)
    assert decision == SEND


def test_an_absence_after_the_key_retention_still_needs_a_person() -> None:
    late = T0 + timedelta(hours=30)
    absent = evidence("absent", at=late - S)
    decision = decide(STATUS_API, operation(), [attempt()], [absent], grant(), late)
    assert isinstance(decision, NeedsReview)
    assert "keeps keys 24 h" in decision.reason and "create a new effect" in decision.reason


# -- rule 6: a search is read only once it can have caught up ----------------------------------


def test_a_search_is_asked_exactly_when_its_lag_has_passed() -> None:
    op, attempts = operation(action="email.send.v1"), [attempt()]
    visible = T0 + 20 * S + 30 * S
    decision = decide(SEARCH_ONLY, op, attempts, [], grant(), visible - S)
    assert isinstance(decision, HoldUnknown) and decision.next_check == visible
    assert "waiting for search to catch up" in decision.reason
    assert decide(SEARCH_ONLY, op, attempts, [], grant(), visible) == AskProvider()
    nothing = evidence("inconclusive", at=visible)  # asked the moment it could know
    decision = decide(SEARCH_ONLY, op, attempts, [nothing], grant(), visible + S)
    assert isinstance(decision, NeedsReview)
    assert "neither deduplicates nor answers authoritatively; a retry could" in decision.reason


# -- rule 2: a refusal must bind this request ----------------------------------------------------


def test_a_refusal_that_names_another_target_or_key_rejects_nothing() -> None:
    for foreign in (
        evidence("rejected", source="dispatch", attempt_n=1, target="case-999", code="nope"),
        evidence("rejected", source="dispatch", attempt_n=1, key="someone-else", code="nope"),
    ):
        decision = decide(keyed(), operation(), [attempt()], [foreign], grant(), AFTER)
        assert not isinstance(decision, Reject)


def test_a_single_attempt_refused_is_rejected_even_without_dedup() -> None:
    refusal = evidence("rejected", source="dispatch", attempt_n=1, code="smtp_refused")
    decision = decide(NO_DEDUP, operation(), [attempt()], [refusal], grant(), T0 + S)
    assert decision == Reject(evidence_id=refusal.id)


def test_a_refusal_of_an_attempt_missing_from_the_history_rejects_nothing() -> None:
    refusal = evidence("rejected", source="dispatch", attempt_n=2, code="case_not_found")
    decision = decide(keyed(), operation(), [attempt(1)], [refusal], grant(), AFTER)
    assert not isinstance(decision, Reject)


# -- rule 8: authority is re-checked before every write ----------------------------------------


def test_an_authorization_that_expires_stops_writes_from_then_on() -> None:
    prepared = operation(Status.PREPARED, fence=0)
    expiring = grant().model_copy(update={"expires_at": T0 + 10 * S})
    assert decide(keyed(), prepared, [], [], expiring, T0 + 9 * S) == SEND
    decision = decide(keyed(), prepared, [], [], expiring, T0 + 10 * S)
    assert (
        isinstance(decision, NeedsReview) and "revoked before anything was sent" in decision.reason
    )
    lost = decide(keyed(), operation(), [attempt()], [], expiring, AFTER)
    assert isinstance(lost, NeedsReview)
    assert "revoked; the outcome of the last attempt is unknown" in lost.reason


def test_an_operation_past_prepared_with_no_attempt_goes_to_a_person() -> None:
    decision = decide(keyed(), operation(Status.UNKNOWN), [], [], grant(), AFTER)
    assert (
        isinstance(decision, NeedsReview) and "unknown with no attempt on record" in decision.reason
    )


def test_a_final_operation_has_nothing_to_decide_and_says_which() -> None:
    with pytest.raises(ValueError, match=f"{OP_ID} is confirmed"):
        decide(keyed(), operation(Status.CONFIRMED), [attempt()], [], grant(), AFTER)


def test_attempts_that_sent_nothing_are_bounded_by_max_attempts_exactly() -> None:
    def unsent(n: int) -> tuple[list[Any], list[Any]]:
        attempts = [attempt(i) for i in range(1, n + 1)]
        return attempts, [dispatched("not_sent", n=i) for i in range(1, n + 1)]

    for n in (3, 4):
        attempts, history = unsent(n)
        assert decide(NO_DEDUP, operation(), attempts, history, grant(), T0 + 2 * S) == SEND
    attempts, history = unsent(5)
    decision = decide(NO_DEDUP, operation(), attempts, history, grant(), T0 + 2 * S)
    assert isinstance(decision, NeedsReview)


def test_a_key_exactly_as_long_as_the_provider_accepts_is_sent() -> None:
    prepared = operation(Status.PREPARED, fence=0)
    assert decide(keyed(max_key_length=len(KEY)), prepared, [], [], grant(), T0) == SEND
    decision = decide(keyed(max_key_length=len(KEY) - 1), prepared, [], [], grant(), T0)
    assert isinstance(decision, NeedsReview)


# -- an operator's retry: the person saw the consequences, authority and rule 3 still hold ------


def test_an_operators_retry_is_sent_once_nothing_is_in_flight_and_authority_holds() -> None:
    op = operation(operator_retry_by="alice")
    # without the operator, a person would be asked (rule 7, and a mismatched key)
    assert isinstance(decide(NO_DEDUP, operation(), [attempt()], [], grant(), AFTER), NeedsReview)
    mismatch = dispatched("idempotency_mismatch")
    assert isinstance(
        decide(keyed(), operation(), [attempt()], [mismatch], grant(), AFTER), NeedsReview
    )
    assert decide(NO_DEDUP, op, [attempt()], [], grant(), AFTER) == SEND
    assert decide(keyed(), op, [attempt()], [mismatch], grant(), AFTER) == SEND
    assert decide(NO_DEDUP, op, [attempt()], [], grant(), T0 + 5 * S) == Wait(until=T0 + 20 * S)
    revoked = decide(NO_DEDUP, op, [attempt()], [], grant(revoked=True), AFTER)
    assert (
        isinstance(revoked, NeedsReview) and "the operator's retry was not sent" in revoked.reason
    )


def test_a_key_used_with_another_payload_is_named_in_the_review() -> None:
    mismatch = dispatched("idempotency_mismatch")
    decision = decide(keyed(), operation(), [attempt()], [mismatch], grant(), AFTER)
    assert isinstance(decision, NeedsReview)
    assert "this key was used with a different payload" in decision.reason


# -- rules 5 and 10 through _retry --------------------------------------------------------------


def test_a_key_that_a_failure_poisons_is_retried_until_the_provider_says_so() -> None:
    tolerant = keyed(after_error="nothing_applied")
    poisonable = tolerant.model_copy(
        update={
            "idempotency": tolerant.idempotency.model_copy(
                update={"failed_attempt_poisons_key": True}
            )
        }
    )
    timeout = dispatched("timeout")
    assert decide(poisonable, operation(), [attempt()], [timeout], grant(), AFTER) == SEND
    poisoned = dispatched("key_poisoned")
    decision = decide(poisonable, operation(), [attempt()], [poisoned], grant(), AFTER)
    assert isinstance(decision, NeedsReview)
    assert "refuses this key after a failed attempt and wants a new one" in decision.reason
    # a provider that never poisons keys: the code is no reason to stop
    assert decide(tolerant, operation(), [attempt()], [poisoned], grant(), AFTER) == SEND


def test_a_replayed_or_stored_error_is_named_in_the_review() -> None:
    replayed = dispatched("http_503", replayed=True)
    atomic = keyed(after_error="nothing_applied")
    decision = decide(atomic, operation(), [attempt()], [replayed], grant(), AFTER)
    assert isinstance(decision, NeedsReview)
    assert "the provider replays what it stored for this key" in decision.reason
