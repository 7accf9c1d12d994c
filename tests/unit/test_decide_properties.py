"""Property tests: over generated histories and every contract, the decision never breaks
a numbered rule of the retry decision (docs/rules.md)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st

from opledger.adapters.crm import crm_contract
from opledger.adapters.email import email_contract
from opledger.adapters.presets import PRESETS
from opledger.adapters.smtp import smtp_contract
from opledger.ledger import (
    Ambiguous,
    Attempt,
    Authorization,
    Binding,
    Claim,
    Confirmed,
    Evidence,
    Operation,
    Outcome,
    Rejected,
    Status,
)
from opledger.ledger.contract import Contract
from opledger.ledger.decide import Confirm, Decision, Dispatch, HoldUnknown, Reject, Wait, decide
from opledger.ledger.evidence import admit, replayed_answer
from tests.depth import examples

from .histories import DIGEST, KEY, OP_ID, T0, attempt, claim, evidence, grant, operation

S = timedelta(seconds=1)
History = tuple[Contract, Operation, list[Attempt], list[Evidence], Authorization | None, datetime]
UnreadHistory = tuple[Contract, Operation, list[Attempt], list[Evidence], datetime]

CONTRACTS: list[Contract] = [
    *PRESETS.values(),
    crm_contract(),
    crm_contract(keys=False),
    crm_contract(lookup="search"),
    crm_contract(lookup="none"),
    crm_contract(keys=False, lookup="search"),
    crm_contract(keys=False, lookup="none"),
    email_contract(),
    email_contract(keys=False),
    smtp_contract(),
]


@st.composite
def contracts(draw: st.DrawFn) -> Contract:
    base = draw(st.sampled_from(CONTRACTS))
    timeout = timedelta(seconds=draw(st.integers(1, 120)))
    in_flight = timeout + timedelta(seconds=draw(st.integers(0, 600)))
    update: dict[str, object] = {"request_timeout": timeout, "max_in_flight": in_flight}
    if base.idempotency.kind == "keyed" and draw(st.booleans()):
        # every fact of a keyed contract, in every combination
        update["idempotency"] = base.idempotency.model_copy(
            update={
                "after_error": draw(
                    st.sampled_from(["replayed", "nothing_applied", "key_released"])
                ),
                "keys_durable": draw(st.booleans()),
                "payload_checked": draw(st.booleans()),
                "concurrent": draw(st.sampled_from(["conflict", "unchecked"])),
                "failed_attempt_poisons_key": draw(st.booleans()),
                "max_key_length": draw(st.sampled_from([None, 10, 64])),
                "scope": draw(st.sampled_from(["account a", "account b"])),
            }
        )
    update["response_binds"] = draw(st.sampled_from(["nothing", "key", "key_and_digest"]))
    update["limits"] = base.limits.model_copy(
        update={"throttle_applies_nothing": draw(st.booleans())}
    )
    return base.model_copy(update=update)


CODES = [
    "timeout",
    "connection_lost",
    "server_error",
    "in_flight",
    "idempotency_mismatch",
    "key_poisoned",
    "http_503",
    "not_sent",
    "state_conflict",
    "binding_mismatch",
    "uncoded_refusal",
    "throttled",
]


def _evidence(
    verdict: str,
    source: str,
    key: str | None,
    target: str | None,
    digest: str | None,
    receipt: str | None,
    code: str,
    replayed: bool,
    at: int,
    n: int,
    scope: str | None,
    conflicting: bool,
) -> Evidence:
    extra: dict[str, object] = {"code": code, "replayed": replayed}
    if code == "throttled" and at % 3:
        extra["retry_after_s"] = (at % 7) * 300.0  # up to 30 min: past the 10 min cap too
    if scope:
        extra["scope"] = scope
    if conflicting:
        extra["conflicting_state"] = True
    return evidence(
        verdict,
        source=source,
        key=key,
        target=target,
        digest=digest,
        receipt=receipt,
        at=T0 + at * S,
        attempt_n=n,
        **extra,
    )


@st.composite
def histories(
    draw: st.DrawFn,
) -> History:
    contract = draw(contracts())
    n = draw(st.integers(0, 6))
    starts = sorted(draw(st.lists(st.integers(0, 3 * 86400), min_size=n, max_size=n)))
    attempts = [
        attempt(
            i + 1,
            started=T0 + s * S,
            in_flight=contract.max_in_flight,
            outcome=draw(st.sampled_from([None, "ambiguous"])),
        )
        for i, s in enumerate(starts)
    ]
    status = (
        Status.UNKNOWN if attempts else draw(st.sampled_from([Status.PREPARED, Status.UNKNOWN]))
    )
    op = operation(
        status,
        provider_result_id=draw(st.sampled_from([None, "rcpt-1"])),
        operator_retry_by=draw(st.sampled_from([None, None, None, "alice"])) if attempts else None,
    )
    evidence_items = draw(
        st.lists(
            st.builds(
                _evidence,
                st.sampled_from(
                    [
                        "confirmed",
                        "rejected",
                        "ambiguous",
                        "ambiguous",
                        "ambiguous",
                        "absent",
                        "pending",
                        "inconclusive",
                    ]
                ),
                st.sampled_from(["dispatch", "dispatch", "lookup"]),
                # ours, the operation's id (never its key), another key, none
                st.sampled_from([KEY, OP_ID, "opk_7ZQ3M1XK9D4VB2N8C6RT0HJW5G", None]),
                st.sampled_from(["case-318", "case-999", None]),
                st.sampled_from([DIGEST, "b" * 64, None]),
                st.sampled_from([None, "rcpt-1", "rcpt-2"]),
                st.sampled_from(CODES),
                st.sampled_from([False, False, False, True]),  # replayed
                st.integers(0, 4 * 86400),
                st.integers(1, max(n, 1)),
                st.sampled_from([None, "account a", "account b"]),
                st.booleans(),
            ),
            max_size=6,
        )
    )
    auth = draw(st.sampled_from([grant(), grant(revoked=True), None]))
    now = T0 + draw(st.integers(0, 5 * 86400)) * S
    retention = contract.idempotency.retention
    mode = draw(st.sampled_from(["anywhere", "after_deadline", "retention_edge"]))
    if attempts and mode == "after_deadline":
        # just after the last in-flight deadline: where retries become possible
        now = max(a.deadline_at for a in attempts) + draw(st.integers(0, 120)) * S
    if attempts and retention is not None and mode == "retention_edge":
        # near the end of the key's retention: where a careless retry would do harm
        edge = min(a.started_at for a in attempts) + retention
        now = edge - draw(st.integers(-60, 2 * int(contract.retention_margin.total_seconds()))) * S
    return contract, op, attempts, evidence_items, auth, now


def _binds(ev: Evidence, op: Operation, contract: Contract) -> bool:
    b = ev.binding
    ours = b.idempotency_key == op.idempotency_key or (
        b.receipt_id is not None and b.receipt_id == op.provider_result_id
    )
    if ev.source == "dispatch" and ev.verdict == "confirmed":
        if contract.response_binds != "nothing" and b.idempotency_key is None:
            return False  # the provider names our key and this response does not
        if contract.response_binds == "key_and_digest" and b.payload_digest is None:
            return False
        replayed = bool(ev.detail.get("replayed"))
        if replayed and not contract.idempotency.payload_checked and b.payload_digest is None:
            return False  # maybe someone else's stored response
    elif ev.verdict == "confirmed":
        idem = contract.idempotency
        if idem.kind == "keyed" and not idem.payload_checked and b.payload_digest is None:
            return False  # a lookup by key cannot tell whose body the key carried
    return ours and b.target in (None, op.target) and b.payload_digest in (None, op.payload_digest)


def _code(ev: Evidence) -> object:
    return ev.detail.get("code")


def _reached(
    contract: Contract, attempts: list[Attempt], evidence_items: list[Evidence]
) -> list[Attempt]:
    """Attempts that may have executed at the provider: all but those that provably sent
    nothing, and, where the provider refuses concurrent requests, those it so refused."""
    skip_codes = {"not_sent"}
    if contract.idempotency.concurrent == "conflict":
        skip_codes.add("in_flight")
    if contract.limits.throttle_applies_nothing:
        skip_codes.add("throttled")
    skipped = {
        ev.attempt_n for ev in evidence_items if ev.source == "dispatch" and _code(ev) in skip_codes
    }
    return [a for a in attempts if a.n not in skipped]


@settings(max_examples=examples(1500), deadline=None)
@given(histories())
def test_the_decision_keeps_every_rule(history: History) -> None:  # noqa: C901
    contract, op, attempts, evidence_items, auth, now = history
    decision: Decision = decide(contract, op, attempts, evidence_items, auth, now)
    event(type(decision).__name__)
    by_id = {ev.id: ev for ev in evidence_items}
    reached = _reached(contract, attempts, evidence_items)

    if isinstance(decision, Confirm):
        ev = by_id[decision.evidence_id]
        # rule 1: only evidence that binds this operation (and carries what the provider's
        # responses bind), never absence, a bare state match or someone else's replay
        assert ev.verdict == "confirmed" and _binds(ev, op, contract)

    if isinstance(decision, Reject):
        ev = by_id[decision.evidence_id]
        # rule 2: only a definitive refusal of this request, never a timeout or a 5xx
        assert ev.verdict == "rejected" and _binds(ev, op, contract)
        # rule 11: never a conflicting state that our own earlier attempt may have caused
        assert not (ev.detail.get("conflicting_state") and len(reached) > 1)
        # and never a refusal of one attempt while a later one may have applied, nor while
        # an earlier one under a key that did not protect it may have
        if ev.source == "dispatch":
            assert all(a.n <= (ev.attempt_n or 0) for a in reached)
            earlier = [a for a in reached if a.n < (ev.attempt_n or 0)]
            if earlier:
                idem = contract.idempotency
                assert idem.kind == "keyed" and idem.keys_durable
                assert idem.after_error != "key_released" or all(
                    a.outcome in ("confirmed", "rejected") for a in earlier
                )

    if isinstance(decision, Wait):
        assert decision.until > now
    if isinstance(decision, HoldUnknown):
        assert decision.next_check > now

    if isinstance(decision, Dispatch):
        # the same key and the same frozen payload, always
        assert decision.idempotency_key == op.idempotency_key
        assert decision.payload_digest == op.payload_digest
        # rule 8: authority re-checked before every new write
        assert auth is not None and auth.active_at(now)
        # a key the provider would refuse is never sent
        limit = contract.idempotency.max_key_length
        assert (
            contract.idempotency.kind == "none" or limit is None or len(op.idempotency_key) <= limit
        )
        # rule 3: never while an earlier attempt may still be in flight, nor right after the
        # provider said one with our key was still executing
        assert all(now >= a.deadline_at for a in reached)
        if contract.idempotency.concurrent == "conflict":
            assert all(
                now >= ev.recorded_at + S
                for ev in evidence_items
                if ev.source == "dispatch" and _code(ev) == "in_flight"
            )
        # a provider's "not now": never before the wait it asked for (capped by the
        # contract), or the contract's default wait when it named none
        for ev in evidence_items:
            if ev.source == "dispatch" and _code(ev) == "throttled":
                asked = ev.detail.get("retry_after_s")
                wait = (
                    contract.limits.retry_after_default
                    if asked is None
                    else min(timedelta(seconds=float(asked)), contract.limits.retry_after_max)
                )
                assert now >= ev.recorded_at + wait
        if not reached:
            return  # nothing ever reached the provider: sending is a first attempt
        if op.operator_retry_by is not None:
            return  # a person authorized it, having seen the consequences (rules 4-7 waived)
        dispatch_codes = [_code(ev) for ev in evidence_items if ev.source == "dispatch"]
        # rule 5: a replayed stored error is not retried in a loop (unless an authoritative
        # status API has since said it holds no such request)
        proven_absent = any(
            ev.verdict == "absent"
            and ev.source == "lookup"
            and ev.binding.idempotency_key == op.idempotency_key
            for ev in evidence_items
        )
        replayed = any(
            ev.detail.get("replayed") for ev in evidence_items if ev.source == "dispatch"
        )
        assert not replayed or proven_absent
        # rule 12: a key answered with another request's answer (or a 422 that may say
        # so) protects nothing: never sent again without a person
        assert "idempotency_mismatch" not in dispatch_codes
        assert "binding_mismatch" not in dispatch_codes
        assert "uncoded_refusal" not in dispatch_codes
        # rule 13: "not now" answers say nothing of the operation and are not counted
        throttled = {
            ev.attempt_n
            for ev in evidence_items
            if ev.source == "dispatch" and _code(ev) == "throttled"
        }
        assert len([a for a in reached if a.n not in throttled]) < contract.max_attempts
        idem = contract.idempotency
        if idem.kind == "keyed":
            # rule 4: inside the key's retention window, minus the margin
            assert idem.retention is not None
            first = min(a.started_at for a in reached if a.idempotency_key == op.idempotency_key)
            assert now + contract.retention_margin < first + idem.retention
            if not proven_absent:
                # rule 10: the key must protect this retry
                assert idem.keys_durable
                assert not (
                    idem.after_error == "key_released"
                    and any(a.outcome not in ("confirmed", "rejected") for a in reached)
                )
                scopes = {
                    ev.detail["scope"]
                    for ev in evidence_items
                    if ev.source == "dispatch" and "scope" in ev.detail
                }
                assert scopes <= {idem.scope}
                if idem.after_error == "replayed":
                    assert "server_error" not in dispatch_codes
        else:
            # rule 6/7: without dedup, only an authoritative "no such request" seen
            # after every attempt's deadline makes a retry safe
            last_deadline = max(a.deadline_at for a in reached)
            assert contract.lookup.kind == "status_api"
            assert any(
                ev.verdict == "absent"
                and ev.source == "lookup"
                and ev.recorded_at >= last_deadline
                and ev.binding.idempotency_key == op.idempotency_key
                for ev in evidence_items
            )


def _scoped(scope: str | None) -> dict[str, Any]:
    """The evidence's `scope` detail: absent, not None, when the provider named none."""
    return {"scope": scope} if scope else {}


@st.composite
def unread_histories(
    draw: st.DrawFn,
) -> UnreadHistory:
    """Keyed contracts with every combination of facts, after attempts whose outcome was
    never read (timeouts, resets, 5xx), past every deadline: where a same-key retry is
    decided by the key's protection alone."""
    base = draw(st.sampled_from([c for c in CONTRACTS if c.idempotency.kind == "keyed"]))
    idem = base.idempotency.model_copy(
        update={
            "after_error": draw(st.sampled_from(["replayed", "nothing_applied", "key_released"])),
            "keys_durable": draw(st.booleans()),
            "scope": draw(st.sampled_from(["account a", "account b"])),
            "failed_attempt_poisons_key": False,
        }
    )
    contract = base.model_copy(
        update={"idempotency": idem, "lookup": base.lookup.model_copy(update={"kind": "none"})}
    )
    n = draw(st.integers(1, 3))
    attempts = [
        attempt(i + 1, started=T0 + i * 600 * S, in_flight=contract.max_in_flight) for i in range(n)
    ]
    evidence_items = [
        evidence(
            "ambiguous",
            source="dispatch",
            attempt_n=i + 1,
            code=draw(st.sampled_from(["timeout", "connection_lost", "server_error"])),
            replayed=False,
            **_scoped(draw(st.sampled_from([None, "account a", "account b"]))),
        )
        for i in range(n)
    ]
    now = max(a.deadline_at for a in attempts) + draw(st.integers(1, 3600)) * S
    return contract, operation(), attempts, evidence_items, now


@settings(max_examples=examples(1000), deadline=None)
@given(unread_histories())
def test_a_same_key_retry_only_where_the_key_protects_it(history: UnreadHistory) -> None:
    contract, op, attempts, evidence_items, now = history
    decision = decide(contract, op, attempts, evidence_items, grant(), now)
    event(type(decision).__name__)
    if not isinstance(decision, Dispatch):
        return
    idem = contract.idempotency
    # rule 10: the provider keeps keys across restarts, does not drop a key on a failure,
    # and every earlier attempt went to the scope this one goes to
    assert idem.keys_durable
    assert idem.after_error != "key_released"
    assert all(ev.detail.get("scope", idem.scope) == idem.scope for ev in evidence_items)
    # rule 5: a provider that stores its 5xx replays it
    if idem.after_error == "replayed":
        assert all(ev.detail["code"] != "server_error" for ev in evidence_items)


@st.composite
def answers(draw: st.DrawFn) -> tuple[Contract, Claim, Outcome]:
    """What a provider may answer an attempt with, replayed or not: a receipt for our
    request or for another one, a refusal (of a state our earlier attempt may have caused,
    or of this request), or an error."""
    contract = draw(contracts())
    n = draw(st.integers(1, 4))
    replayed = draw(st.booleans())
    kind = draw(st.sampled_from(["receipt", "foreign", "conflict", "refusal", "error"]))
    detail: dict[str, object] = {"replayed": replayed}
    outcome: Outcome
    if kind in ("receipt", "foreign"):
        outcome = Confirmed(
            receipt_id="rcpt-1",
            binding=Binding(
                idempotency_key=KEY,
                target="case-318" if kind == "receipt" else draw(st.sampled_from([None, "c-9"])),
                payload_digest=DIGEST if kind == "receipt" else "b" * 64,
            ),
            detail=detail,
        )
    elif kind in ("conflict", "refusal"):
        outcome = Rejected(
            code="case_already_closed",
            reason="closed",
            conflicting_state=kind == "conflict",
            detail=detail,
        )
    else:
        outcome = Ambiguous(code="server_error", reason="HTTP 500", replayed=replayed)
    return contract, claim(n), outcome


@settings(max_examples=examples(500), deadline=None)
@given(answers())
def test_a_replayed_answer_stays_marked_whatever_it_is_admitted_as(
    answer: tuple[Contract, Claim, Outcome],
) -> None:
    """The replayed-refusal and foreign-receipt worlds: `admit` may turn a replayed answer
    into an ambiguous one (a state conflict, another request's receipt), and the evidence
    then still says it was replayed, so rule 5 and rule 12 can fire."""
    contract, the_claim, outcome = answer
    admitted = admit(contract, the_claim, outcome)
    event(f"{outcome.kind} -> {admitted.kind}")
    assert replayed_answer(admitted) is replayed_answer(outcome)
    if isinstance(admitted, Ambiguous):  # the flag the recorded evidence is written from
        assert admitted.replayed is replayed_answer(outcome)
    if isinstance(admitted, Ambiguous) and admitted.code == "binding_mismatch":
        assert "another one" in admitted.reason
