"""The console's payload redaction: per-action rules and always-hidden secrets."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.console.redaction import Redaction
from opledger.ledger.errors import InvalidInput


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
        "auth": {"Token": "[hidden: text, 3 characters]"},
    }
    assert hidden == ["text", "auth.Token"]
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
    assert rules.apply("crm.update_case.v1", payload)[0]["note"] == "[hidden: text, 1 characters]"
    assert payload["customer"]["email"] == "x@y.test"  # the payload itself is untouched


@pytest.mark.parametrize("spec", ["crm.*", "=note", "crm.*=", "crm.*= , "])
def test_a_malformed_rule_is_refused(spec: str) -> None:
    with pytest.raises(InvalidInput, match="ACTION=field"):
        Redaction.parse([spec])
