"""A console operator whose name reads as another one's cannot be added: the accounts take
names through the ledger's own check, invisible characters included."""

from __future__ import annotations

import pytest

from opledger.console.accounts import Accounts
from opledger.ledger import InvalidIdentifier, Ledger


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("al\u034fice", "U+034F COMBINING GRAPHEME JOINER"),
        ("alice\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
        ("al\u17b4ice", "U+17B4 KHMER VOWEL INHERENT AQ"),
    ],
)
def test_a_name_with_an_invisible_character_is_not_an_operator(
    ledger: Ledger, name: str, shown: str
) -> None:
    accounts = Accounts(ledger.engine)
    accounts.add("alice", tenants=["acme"], password=None, by="root")
    with pytest.raises(InvalidIdentifier) as info:
        accounts.add(name, tenants=["acme"], password=None, by="root")
    assert f"operator contains {shown}" in str(info.value) and str(info.value).isascii()
    with pytest.raises(InvalidIdentifier):
        accounts.add("mallory", tenants=["acme"], password=None, by=name)
    assert [o.name for o in accounts.list()] == ["alice"]
    assert accounts.operator(name) is None
