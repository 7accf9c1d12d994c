"""What a reviewer is told each resolution could cause, for each contract kind."""

from __future__ import annotations

from datetime import timedelta

from opledger.adapters.crm import crm_contract
from opledger.adapters.email import email_contract
from opledger.adapters.presets import RESEND, SES, STRIPE_V1
from opledger.adapters.smtp import smtp_contract
from opledger.ledger.consequences import consequences

from .histories import OP_ID, T0, attempt, operation

H = timedelta(hours=1)
EMAIL = operation(action="email.send.v1", target="owner@acme.test")


def test_a_key_past_retention_needs_a_new_key_and_says_why() -> None:
    c = consequences(RESEND, EMAIL, [attempt(in_flight=timedelta(minutes=2))], T0 + 31 * H)
    assert not c.same_key_retry_allowed
    assert c.key_age == 31 * H
    assert c.retry_new_key.startswith(
        "Retrying with a new key may send a second email: the provider keeps keys 24 h and "
        "this key is 31 h old."
    )
    assert "Not protected by the key" in c.retry and "keeps keys 24 h" in c.retry
    assert "accepted the message, not that it was delivered" not in c.retry_new_key


def test_a_key_inside_retention_can_be_retried_safely() -> None:
    case = operation(action="crm.close_case.v1")
    c = consequences(STRIPE_V1, case, [attempt()], T0 + 2 * H)
    assert c.same_key_retry_allowed
    assert "answers from it and no second payment" in c.retry  # the contract names the effect
    assert "replays stored errors" in c.retry  # Stripe v1 stores its 500s


def test_the_retention_margin_counts() -> None:
    contract = crm_contract(retention=timedelta(hours=24), retention_margin=timedelta(hours=1))
    c = consequences(contract, operation(), [attempt()], T0 + 23 * H + timedelta(minutes=30))
    assert not c.same_key_retry_allowed


def test_no_dedup_says_a_retry_may_repeat_the_effect() -> None:
    for contract in (SES, smtp_contract(), crm_contract(keys=False)):
        c = consequences(contract, EMAIL, [attempt()], T0 + 2 * H)
        assert "does not deduplicate" in c.retry
        assert c.retry == c.retry_new_key
    ses = consequences(SES, EMAIL, [attempt()], T0 + 2 * H)
    assert "accepted the message, not that it was delivered" in ses.retry


def test_an_attempt_still_in_flight_is_mentioned() -> None:
    c = consequences(email_contract(), EMAIL, [attempt(in_flight=2 * H)], T0 + H)
    assert "may still be in flight" in c.retry


def test_cancel_and_confirm_explain_what_stays() -> None:
    c = consequences(RESEND, EMAIL, [attempt()], T0 + H)
    assert "no automatic compensation" in c.cancel
    assert "without provider proof" in c.confirmed
    assert OP_ID not in c.cancel  # consequences speak of effects, not internals
