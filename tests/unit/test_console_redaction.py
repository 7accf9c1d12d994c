"""What the console and the CLI show of a payload, a response, evidence and a result:
per-action rules, and secrets hidden everywhere (by name and shape: test_sensitive.py)."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.console.redaction import Redaction
from opledger.ledger.errors import InvalidInput
from opledger.ledger.sensitive import RedactionRuleInvalid

from .histories import KEY, attempt
from .histories import evidence as evidence_of


def test_the_bundled_rules_hide_an_emails_content_and_secrets_everywhere() -> None:
    rules = Redaction()
    shown, hidden = rules.apply(
        "email.send.v1",
        {"to": "a@b.test", "subject": "Hi", "text": "secret body", "auth": {"Token": "t0k"}},
    )
    assert shown == {
        "to": "a@b.test",
        "subject": "Hi",
        "text": "[hidden: text, 11 characters]",
        "auth": "[hidden: object, 1 field]",
    }
    assert hidden == ["text", "auth"]
    shown, hidden = rules.apply("crm.close_case.v1", {"text": "kept", "note": "kept"})
    assert shown == {"text": "kept", "note": "kept"} and hidden == []


def test_a_rule_names_an_action_or_a_prefix_and_dotted_paths_through_lists() -> None:
    rules = Redaction.parse(["crm.*=customer.email,lines.price", "crm.update_case.v1=note"])
    payload: dict[str, Any] = {
        "note": "n",
        "customer": {"email": "x@y.test", "name": "X"},
        "lines": [{"price": 3, "sku": "a"}, {"price": 4, "sku": "b"}],
    }
    shown, hidden = rules.apply("crm.close_case.v1", payload)
    assert shown["customer"] == {"email": "[hidden: text, 8 characters]", "name": "X"}
    assert shown["lines"] == [
        {"price": "[hidden: int]", "sku": "a"},
        {"price": "[hidden: int]", "sku": "b"},
    ]
    assert shown["note"] == "n"
    assert hidden == ["customer.email", "lines[0].price", "lines[1].price"]
    assert rules.apply("crm.update_case.v1", payload)[0]["note"] == "[hidden: text, 1 character]"
    assert payload["customer"]["email"] == "x@y.test"  # the payload itself is untouched


@pytest.mark.parametrize("spec", ["crm.*", "=note", "crm.*=", "crm.*= , "])
def test_a_malformed_rule_is_refused(spec: str) -> None:
    with pytest.raises(InvalidInput, match="ACTION=field"):
        Redaction.parse([spec])


SECRETS: dict[str, Any] = {
    "card": {"number": "4111 1111 1111 1111", "exp": "12/30"},
    "cardNumber": "5555555555554444",
    "access_token": "at-visible",
    "client_secret": "cs-visible",
    "new_password": "pw-visible",
    "headers": {"X-Api-Key": "key-visible", "Accept": "application/json"},
    "pan": "pan-visible",
    "memo": "retry with Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl",
}
CLEAR = (
    "4111",
    "5555",
    "at-visible",
    "cs-visible",
    "pw-visible",
    "key-visible",
    "pan-visible",
    "eyJ",
)


def test_payloads_responses_details_and_results_hide_secrets_for_every_action() -> None:
    rules = Redaction.parse(["pay.*=customer.email"])
    shown, hidden = rules.apply("crm.close_case.v1", SECRETS)
    assert not any(c in repr(shown) for c in CLEAR), shown
    assert shown["card"]["exp"] == "12/30" and shown["headers"]["Accept"] == "application/json"
    assert hidden == [
        "card.number",
        "cardNumber",
        "access_token",
        "client_secret",
        "new_password",
        "headers.X-Api-Key",
        "pan",
        "memo",
    ]
    doc = {"customer": {"email": "ann@example.com"}, **SECRETS}
    response = {"status": 502, "body": SECRETS, "result": doc}
    detail = {"lookup": {"headers": SECRETS["headers"]}, "receipt": {"result": doc}}
    attempts, evidence = rules.results(
        "pay.charge.v1",
        [attempt().model_copy(update={"response": response})],
        [evidence_of("confirmed", key=KEY).model_copy(update={"detail": detail})],
    )
    for document in (attempts[0].response, evidence[0].detail):
        assert not any(c in repr(document) for c in CLEAR), document
        assert "ann@example.com" not in repr(document)  # the action's rule, in results
    assert attempts[0].response is not None and attempts[0].response["status"] == 502
    # a document the snapshot of a review holds is shown the same way
    snapshot = rules.document("pay.charge.v1", {"attempts": [{"response": response}]})
    assert not any(c in repr(snapshot) for c in (*CLEAR, "ann@")), snapshot


def test_configured_rules_come_from_the_setting_then_the_options() -> None:
    rules = Redaction.configured("crm.*=note; email.*=subject", ["crm.*=customer.email"])
    assert rules.paths_for("crm.close_case.v1") == ("note", "customer.email")
    assert rules.paths_for("email.send.v1") == ("text", "html", "body", "attachments", "subject")
    assert Redaction.configured(None).paths_for("crm.close_case.v1") == ()
    with pytest.raises(RedactionRuleInvalid, match=r"'crm\.note': use ACTION=field"):
        Redaction.configured("crm.note")
