"""Review rules that hold on every path (Python API and CLI): every new fact makes a view
stale, a resolution against bound evidence needs an override, a resolution needs a
recorded view, a retry that could repeat an effect needs the risk acknowledged, and
operator names are what they look like."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from opledger.adapters.registry import Registry
from opledger.adapters.smtp import SmtpAdapter, message_id_for, smtp_contract
from opledger.cli.main import app as cli
from opledger.dev.sandbox import Sandbox
from opledger.ledger import (
    Binding,
    ClaimTerms,
    Confirmed,
    ContradictsEvidence,
    InvalidIdentifier,
    Ledger,
    Rejected,
    RetryNeedsAcknowledgement,
    StaleFence,
    StaleView,
    Status,
)
from opledger.tasks import steps
from tests.desks import LEASE, Desk, past_deadlines
from tests.intents import key_of, prepare, prepare_op, smtp_mail


@pytest.fixture
def keyless(ledger: Ledger, sandbox: Sandbox) -> Iterator[Desk]:
    d = Desk(ledger, sandbox, keys=False)
    yield d
    d.close()


def _stalled_in_review(desk: Desk) -> tuple[str, Any]:
    """A worker claimed, froze before its outcome and was fenced out; the operation went
    to review. Returns the operation and the stalled worker's claim."""
    op_id = prepare(desk.ledger, "stalled")
    terms = ClaimTerms(
        lease=timedelta(milliseconds=50),
        in_flight=timedelta(milliseconds=100),
        send_window=timedelta(milliseconds=100),
    )
    claim = desk.ledger.claim(op_id, owner="w1", terms=terms)
    assert claim is not None
    time.sleep(0.1)
    assert desk.ledger.expire_leases() == [op_id]
    desk.review(op_id)
    return op_id, claim


def test_a_late_outcome_kept_as_evidence_makes_the_view_stale(desk: Desk) -> None:
    op_id, claim = _stalled_in_review(desk)
    shown = desk.show(op_id)
    late = Confirmed(
        receipt_id="case-x@v2",
        binding=Binding(idempotency_key=claim.idempotency_key, target=claim.operation.target),
    )
    with pytest.raises(StaleFence):
        desk.ledger.record_outcome(claim, late)
    assert desk.ledger.get(op_id).record_version > shown.operation.record_version
    with pytest.raises(StaleView, match="changed since it was shown"):
        desk.resolve(op_id, "rejected")
    assert desk.ledger.get(op_id).status is Status.UNKNOWN


def test_lookup_evidence_makes_the_view_stale(desk: Desk) -> None:
    op_id = desk.in_review("lookup")
    desk.show(op_id)
    desk.ledger.record_evidence(op_id, source="lookup", verdict="inconclusive")
    with pytest.raises(StaleView):
        desk.resolve(op_id, "cancel")


def test_rejecting_over_a_receipt_that_confirms_needs_an_audited_override(desk: Desk) -> None:
    op_id, claim = _stalled_in_review(desk)
    late = Confirmed(  # everything this CRM's responses bind: our key and the body's digest
        receipt_id="case-x@v2",
        binding=Binding(
            idempotency_key=claim.idempotency_key,
            target=claim.operation.target,
            payload_digest=claim.operation.payload_digest,
        ),
    )
    with pytest.raises(StaleFence):
        desk.ledger.record_outcome(claim, late)
    desk.show(op_id)
    with pytest.raises(ContradictsEvidence, match=r"dispatch evidence .*: confirmed"):
        desk.resolve(op_id, "rejected")
    with pytest.raises(ContradictsEvidence):
        desk.resolve(op_id, "retry")
    assert desk.ledger.get(op_id).status is Status.UNKNOWN
    after = desk.resolve(op_id, "rejected", override_evidence=True)
    assert after.status is Status.REJECTED
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.override_evidence is True and action.resolution == "rejected"


def test_confirming_over_a_definitive_refusal_needs_an_override(desk: Desk) -> None:
    op_id, claim = _stalled_in_review(desk)
    with pytest.raises(StaleFence):
        desk.ledger.record_outcome(claim, Rejected(code="case_not_found", reason="no case"))
    desk.show(op_id)
    with pytest.raises(ContradictsEvidence):
        desk.resolve(op_id, "confirmed")
    assert desk.resolve(op_id, "confirmed", override_evidence=True).status is Status.CONFIRMED


def test_agreeing_with_the_evidence_needs_no_override(desk: Desk) -> None:
    op_id, claim = _stalled_in_review(desk)
    late = Confirmed(receipt_id="r", binding=Binding(idempotency_key=claim.idempotency_key))
    with pytest.raises(StaleFence):
        desk.ledger.record_outcome(claim, late)
    desk.show(op_id)
    assert desk.resolve(op_id, "confirmed").status is Status.CONFIRMED
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.override_evidence is False


def test_the_python_api_cannot_skip_show(desk: Desk) -> None:
    op_id = desk.in_review("skip")
    current = desk.ledger.get(op_id).record_version
    with pytest.raises(StaleView, match="review show"):
        desk.resolve(op_id, "confirmed", seen_version=current)
    desk.show(op_id, operator="bob")  # someone else's view is not alice's
    with pytest.raises(StaleView, match="review show"):
        desk.resolve(op_id, "confirmed", seen_version=current)
    desk.show(op_id)
    with pytest.raises(StaleView, match="not 1"):
        desk.resolve(op_id, "confirmed", seen_version=1)
    desk.resolve(op_id, "confirmed", seen_version=current)
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.shown["record_version"] == current and action.shown["attempts"]


def test_a_no_dedup_retry_needs_the_risk_acknowledged(keyless: Desk) -> None:
    op_id = keyless.in_review("keyless")  # rule 7: no dedup, no lookup
    view = keyless.show(op_id)
    assert "does not deduplicate" in view.consequences.retry
    with pytest.raises(RetryNeedsAcknowledgement, match="accept-risk"):
        keyless.resolve(op_id, "retry")
    assert keyless.ledger.get(op_id).operator_retry_by is None
    after = keyless.resolve(op_id, "retry", acknowledge_risk=True)
    assert after.operator_retry_by == "alice"
    (action,) = keyless.ledger.reviews.audit(op_id, tenant="acme")
    assert action.risk_acknowledged is True and action.new_key is None


def test_a_key_that_no_longer_protects_is_kept_once_the_risk_is_accepted(
    ledger: Ledger, sandbox: Sandbox
) -> None:
    """A provider that releases keys on errors: the key may no longer deduplicate, but it
    still might, so the retry keeps it, once the operator accepts the risk."""
    released = Desk(ledger, sandbox, after_error="key_released")
    try:
        op_id = released.in_review("released")
        view = released.show(op_id)
        assert "releases a key" in view.consequences.retry
        with pytest.raises(RetryNeedsAcknowledgement, match="accept-risk"):
            released.resolve(op_id, "retry")
        key = key_of(released.ledger, op_id)
        assert key.startswith("opk_")
        after = released.resolve(op_id, "retry", acknowledge_risk=True)
        assert after.idempotency_key == key  # the same key, not a new one
        (action,) = released.ledger.reviews.audit(op_id, tenant="acme")
        assert action.risk_acknowledged is True and action.new_key is None
    finally:
        released.close()


def test_a_same_key_retry_within_retention_needs_no_acknowledgement(desk: Desk) -> None:
    op_id = desk.in_review("keyed")
    desk.show(op_id)
    desk.resolve(op_id, "retry")
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.risk_acknowledged is False


#: names that read as alice's (or as a blank) in the audit trail
LOOKALIKE_OPERATORS = {
    "zero-width": "ali\u200bce",
    "bidi": "\u202eecila",
    "word-joiner": "alice\u2060",
    "filler": "\u3164",
    "leading-space": " alice",
    "newline": "alice\n",
    "soft-hyphen": "al\u00adice",
    "grapheme-joiner": "al\u034fice",
    "variation-selector": "alice\ufe0f",
    "leading-mark": "\u0301alice",
}


@pytest.mark.parametrize("name", LOOKALIKE_OPERATORS.values(), ids=LOOKALIKE_OPERATORS.keys())
def test_operator_names_must_be_visible_and_printable(desk: Desk, name: str) -> None:
    op_id = desk.in_review("names")
    with pytest.raises(InvalidIdentifier):
        desk.show(op_id, operator=name)
    desk.show(op_id)
    with pytest.raises(InvalidIdentifier):
        desk.resolve(op_id, "cancel", operator=name)
    assert desk.ledger.get(op_id).status is Status.UNKNOWN


def test_operator_names_in_nfd_are_the_same_operator(desk: Desk) -> None:
    op_id = desk.in_review("nfd")
    desk.show(op_id, operator="Jos\u00e9")  # NFC
    assert desk.resolve(op_id, "cancel", operator="Jose\u0301").status is Status.CANCELLED
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert action.operator == "Jos\u00e9"


def test_the_cli_refuses_an_unacknowledged_smtp_retry(
    ledger: Ledger, database_url: str, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opledger.settings import get_settings

    adapter = SmtpAdapter(
        sandbox.smtp_host,
        sandbox.smtp_port,
        contract=smtp_contract(
            request_timeout=timedelta(seconds=0.5), max_in_flight=timedelta(seconds=0.5)
        ),
    )
    registry = Registry([adapter])
    mail = Ledger(ledger.engine, actions=registry)
    mail.grant(tenant="acme", scope=["email.*"], granted_by="t", ref="auth_acme")
    op = prepare_op(mail, "mail", **smtp_mail("Case closed", "done"))
    sandbox.fault("smtp", "drop_after_data", key=message_id_for(op))
    steps.dispatch(mail, registry, op.id, owner="w1", lease=LEASE)
    past = past_deadlines(mail, op.id)
    reconciled = steps.reconcile(mail, registry, op.id, owner="w2", lease=LEASE, now=past)
    assert reconciled.action == "review"

    monkeypatch.setenv("OPLEDGER_DATABASE_URL", database_url)
    monkeypatch.setenv("OPLEDGER_SMTP_HOST", sandbox.smtp_host)
    monkeypatch.setenv("OPLEDGER_SMTP_PORT", str(sandbox.smtp_port))
    monkeypatch.setenv("COLUMNS", "250")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        base = ["review", "resolve", op.id, "--tenant", "acme", "--operator", "bob"]
        shown = runner.invoke(
            cli, ["review", "show", op.id, "--tenant", "acme", "--operator", "bob"]
        )
        assert shown.exit_code == 0, shown.output
        assert "--accept-risk" in shown.output
        refused = runner.invoke(cli, [*base, "--as", "retry", "--note", "again"])
        assert refused.exit_code == 3, refused.output
        assert "accept-risk" in refused.output
        assert mail.get(op.id).operator_retry_by is None
    finally:
        get_settings.cache_clear()
    after = mail.reviews.resolve(
        op.id,
        tenant="acme",
        operator="bob",
        resolution="retry",
        note="again",
        acknowledge_risk=True,
    )
    assert after.operator_retry_by == "bob"
    assert sandbox.effects(f"smtp:{message_id_for(op)}") == 1  # not sent again yet
