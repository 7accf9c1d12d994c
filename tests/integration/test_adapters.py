"""Each adapter against its sandbox provider over real sockets, every fault mode mapped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.email import EmailAdapter, email_contract
from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ambiguous, Claim, Confirmed, Ledger, Rejected

S = timedelta(seconds=1)
A = TypeVar("A")


def claim_for(
    ledger: Ledger, action: str, target: str, payload: dict[str, Any], key: str = "k"
) -> Claim:
    ledger.grant(tenant="acme", scope=["*"], granted_by="t", ref="auth_all")
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf",
        intent_key=key,
        action=action,
        target=target,
        payload=payload,
        authorization_ref="auth_all",
    )
    claim = ledger.claim(op.id, owner="test")
    assert claim is not None
    return claim


@pytest.fixture
def closing() -> Iterator[Callable[[A], A]]:
    """Close every adapter a test opens (their HTTP clients keep connections)."""
    opened: list[Any] = []

    def track(adapter: A) -> A:
        opened.append(adapter)
        return adapter

    yield track
    for adapter in opened:
        adapter.close()


@pytest.fixture
def crm(crms: Callable[..., CrmAdapter]) -> CrmAdapter:
    return crms(request_timeout=S)


@pytest.fixture
def email(sandbox: Sandbox, closing: Callable[[EmailAdapter], EmailAdapter]) -> EmailAdapter:
    return closing(
        EmailAdapter(sandbox.http_url, account="acme", contract=email_contract(request_timeout=S))
    )


CLOSE = {"note": "resolved"}


def test_crm_close_confirms_with_a_receipt_that_binds_the_version(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    claim = claim_for(ledger, "crm.close_case.v1", "case-318", CLOSE)
    outcome = crm.dispatch(claim)
    assert isinstance(outcome, Confirmed)
    assert outcome.receipt_id == "case-318@v2"
    assert (
        outcome.binding.idempotency_key == claim.idempotency_key
        and outcome.binding.resulting_version == "2"
    )
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == 1
    # the same request again (a retry) is answered from the stored response: no new effect
    again = crm.dispatch(claim)
    assert isinstance(again, Confirmed) and again.detail["replayed"] is True
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == 1
    assert crm.lookup(claim.operation, []).verdict == "confirmed"


@pytest.mark.parametrize(
    ("mode", "code", "applied"),
    [
        ("drop_after_commit", "connection_lost", 1),
        ("delay_after_commit", "timeout", 1),
        ("error_before_commit", "server_error", 0),
        ("error_after_commit", "server_error", 1),
    ],
)
def test_crm_faults_are_ambiguous_never_rejected(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter, mode: str, code: str, applied: int
) -> None:
    sandbox.fault("crm", mode, delay_s=1.5)
    claim = claim_for(ledger, "crm.close_case.v1", "case-318", CLOSE)
    outcome = crm.dispatch(claim)
    assert isinstance(outcome, Ambiguous), outcome
    assert outcome.code == code
    time.sleep(1.6 if mode == "delay_after_commit" else 0)
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == applied
    verdict = crm.lookup(claim.operation, []).verdict
    # the status API answers from the provider's own records: an error that followed the
    # change does not hide it
    # and a failure it recorded without effect, whose key replays it, is a definitive no
    assert verdict == ("confirmed" if applied else "rejected")


def test_crm_replays_a_stored_500_and_says_so(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    sandbox.fault("crm", "error_before_commit")
    claim = claim_for(ledger, "crm.close_case.v1", "case-318", CLOSE)
    first = crm.dispatch(claim)
    second = crm.dispatch(claim)
    assert isinstance(first, Ambiguous) and not first.replayed
    assert isinstance(second, Ambiguous) and second.replayed and second.code == "server_error"
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == 0


def test_crm_in_flight_conflict_and_key_reuse_are_told_apart_by_code(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    sandbox.configure(processing_s=0.5)
    claim = claim_for(ledger, "crm.close_case.v1", "case-318", CLOSE)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(crm.dispatch(claim)))
    first.start()
    time.sleep(0.15)
    concurrent = crm.dispatch(claim)
    first.join()
    assert isinstance(concurrent, Ambiguous) and concurrent.code == "in_flight"
    assert isinstance(results[0], Confirmed)
    changed = claim.model_copy(update={"payload_canonical": '{"note":"other"}'})
    mismatch = crm.dispatch(changed)
    assert isinstance(mismatch, Ambiguous) and mismatch.code == "idempotency_mismatch"
    assert sandbox.effects(f"crm:{claim.idempotency_key}") == 1


def test_crm_definitive_refusals_are_rejections(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    missing = claim_for(ledger, "crm.close_case.v1", "missing-1", CLOSE, key="a")
    outcome = crm.dispatch(missing)
    assert isinstance(outcome, Rejected) and outcome.code == "case_not_found"
    sandbox.close_by_other("acme", "case-77")
    closed = claim_for(ledger, "crm.close_case.v1", "case-77", CLOSE, key="b")
    outcome = crm.dispatch(closed)
    assert isinstance(outcome, Rejected) and outcome.code == "case_already_closed"


def test_crm_status_api_and_search(
    ledger: Ledger, sandbox: Sandbox, crms: Callable[..., CrmAdapter]
) -> None:
    claim = claim_for(ledger, "crm.update_case.v1", "case-5", {"fields": {"tier": "gold"}})
    status = crms(request_timeout=S)
    assert status.lookup(claim.operation, []).verdict == "absent"
    sandbox.configure(search_lag_s=1.0)
    assert isinstance(status.dispatch(claim), Confirmed)
    search = crms(request_timeout=S, lookup="search")
    assert search.lookup(claim.operation, []).verdict == "inconclusive"  # not visible yet
    time.sleep(1.1)
    assert search.lookup(claim.operation, []).verdict == "confirmed"
    sandbox.configure(status_api=False)
    assert status.lookup(claim.operation, []).verdict == "inconclusive"


def test_crm_status_api_binds_our_key_when_the_body_does_not_repeat_it(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter
) -> None:
    sandbox.configure(echo_digest=False)  # success bodies name neither our key nor the body
    claim = claim_for(ledger, "crm.update_case.v1", "case-6", {"fields": {"tier": "gold"}})
    sent = crm.dispatch(claim)
    assert isinstance(sent, Confirmed) and sent.binding.idempotency_key is None
    found = crm.lookup(claim.operation, [])
    assert found.verdict == "confirmed"
    # asked by our key, the answer is about our key
    assert found.binding.idempotency_key == claim.idempotency_key
    assert found.binding.receipt_id == sent.receipt_id and found.binding.target == "case-6"


def test_a_refused_connection_sent_nothing(ledger: Ledger, closing: Any) -> None:
    claim = claim_for(ledger, "crm.close_case.v1", "case-1", CLOSE)
    adapter = closing(
        CrmAdapter("http://127.0.0.1:9", account="acme", contract=crm_contract(request_timeout=S))
    )
    outcome = adapter.dispatch(claim)
    assert isinstance(outcome, Ambiguous) and outcome.code == "not_sent"  # provably nothing sent
    assert adapter.lookup(claim.operation, []).verdict == "inconclusive"


def test_email_accepted_is_custody_and_search_lags(
    ledger: Ledger, sandbox: Sandbox, email: EmailAdapter
) -> None:
    sandbox.configure(search_lag_s=1.0)
    claim = claim_for(
        ledger, "email.send.v1", "owner@acme.test", {"to": "owner@acme.test", "subject": "Closed"}
    )
    outcome = email.dispatch(claim)
    assert isinstance(outcome, Confirmed) and outcome.accepted_only
    assert outcome.receipt_id.startswith("msg_")
    assert email.lookup(claim.operation, []).verdict == "inconclusive"
    time.sleep(1.1)
    found = email.lookup(claim.operation, [])
    assert found.verdict == "confirmed" and found.binding.receipt_id == outcome.receipt_id
    assert sandbox.effects(f"email:{claim.idempotency_key}") == 1


def test_email_409_codes_and_validation(
    ledger: Ledger, sandbox: Sandbox, email: EmailAdapter
) -> None:
    sandbox.configure(processing_s=0.5)
    claim = claim_for(ledger, "email.send.v1", "o@acme.test", {"to": "o@acme.test"})
    done: list[Any] = []
    first = threading.Thread(target=lambda: done.append(email.dispatch(claim)))
    first.start()
    time.sleep(0.15)
    concurrent = email.dispatch(claim)
    first.join()
    assert isinstance(concurrent, Ambiguous) and concurrent.code == "in_flight"
    changed = claim.model_copy(update={"payload": {"to": "someone-else@acme.test"}})
    mismatch = email.dispatch(changed)
    assert isinstance(mismatch, Ambiguous) and mismatch.code == "idempotency_mismatch"
    sandbox.configure(processing_s=0.0)
    bad = claim_for(ledger, "email.send.v1", "nobody", {"to": "nobody"}, key="bad")
    refused = email.dispatch(bad)
    assert isinstance(refused, Rejected) and refused.code == "validation_error"


def test_smtp_send_and_drop_after_data(ledger: Ledger, sandbox: Sandbox) -> None:
    smtp = SmtpAdapter(
        sandbox.smtp_host, sandbox.smtp_port, contract=smtp_contract(request_timeout=S)
    )
    claim = claim_for(
        ledger, "email.smtp_send.v1", "o@acme.test", {"to": "o@acme.test", "subject": "hi"}
    )
    outcome = smtp.dispatch(claim)
    assert isinstance(outcome, Confirmed) and outcome.accepted_only
    effect = f"smtp:{message_id_for(claim.operation)}"
    assert sandbox.effects(effect) == 1
    sandbox.fault("smtp", "drop_after_data")
    lost = smtp.dispatch(claim)
    assert isinstance(lost, Ambiguous) and lost.code == "connection_lost"
    assert sandbox.effects(effect) == 2  # SMTP has no dedup: the provider applied it again
    assert smtp.lookup(claim.operation, []).verdict == "inconclusive"
    refused = SmtpAdapter("127.0.0.1", 9, contract=smtp_contract(request_timeout=S)).dispatch(claim)
    assert isinstance(refused, Ambiguous)


def test_requests_a_key_cannot_protect_never_ride_an_idle_connection(ledger: Ledger) -> None:
    """A server closing an idle kept-alive connection just as we send loses a request that
    never left, and we could only call it a lost connection: for a provider whose key does
    not make a retry safe, every request gets a fresh connection (and a lost one was sent)."""
    with Sandbox(keepalive_timeout=0.3) as sandbox:
        peers: dict[bool, set[str]] = {}
        for keys in (True, False):
            contract = crm_contract(keys=keys, request_timeout=S)
            adapter = CrmAdapter(sandbox.http_url, account="idle", contract=contract)
            sent = []
            try:
                for n in range(3):
                    claim = claim_for(ledger, "crm.update_case.v1", f"c{n}", {}, f"k{keys}{n}")
                    assert adapter.dispatch(claim).kind == "confirmed"
                    sent.append(f"crm:{claim.idempotency_key}")
                    time.sleep(0.5 if n == 1 else 0)  # the server closes the idle connection
            finally:
                adapter.close()
            truth = sandbox.truth()["requests"]
            peers[keys] = {r["peer"] for k in sent for r in truth[k]}
    assert len(peers[True]) == 2  # reused, then a new one after the idle close
    assert len(peers[False]) == 3  # never reused


def test_smtp_reads_the_reply_to_the_message_body(ledger: Ledger, sandbox: Sandbox) -> None:
    smtp = SmtpAdapter(
        sandbox.smtp_host, sandbox.smtp_port, contract=smtp_contract(request_timeout=S)
    )
    payload = {"to": "o@acme.test", "subject": "hi"}
    refused = claim_for(ledger, "email.smtp_send.v1", "o@acme.test", payload, "refused")
    sandbox.fault("smtp", "refuse_after_data")
    outcome = smtp.dispatch(refused)
    assert isinstance(outcome, Rejected), outcome  # 554 after the body: refused for good
    deferred = claim_for(ledger, "email.smtp_send.v1", "o@acme.test", payload, "deferred")
    sandbox.fault("smtp", "defer_after_data")
    outcome = smtp.dispatch(deferred)
    assert isinstance(outcome, Ambiguous) and outcome.code == "not_sent", outcome
    for claim in (refused, deferred):
        assert sandbox.effects(f"smtp:{message_id_for(claim.operation)}") == 0
