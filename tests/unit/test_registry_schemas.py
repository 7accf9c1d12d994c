"""The adapter registry's payload schemas and descriptions: what an agent's tool offers for
each action, declared on the adapter, checked when it is registered."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.email import EmailAdapter
from opledger.adapters.registry import ANY_OBJECT, Registry
from opledger.ledger import UnknownAction


def test_bundled_adapters_declare_a_schema_and_a_description_for_each_action() -> None:
    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
        ]
    )
    for action in registry.actions:
        schema = registry.payload_schema(action)
        assert schema["type"] == "object" and schema != ANY_OBJECT, action
        assert registry.description(action).endswith("."), action
    assert registry.payload_schema("crm.update_case.v1")["required"] == ["fields"]
    assert registry.payload_schema("email.send.v1")["required"] == ["to"]


class _Plain:
    """An adapter that declares neither schemas nor descriptions."""

    def __init__(self, **extras: Any) -> None:
        self.contract = CrmAdapter("http://127.0.0.1:9", account="acme").contract
        self.actions: tuple[str, ...] = ("plain.do.v1",)
        for name, value in extras.items():
            setattr(self, name, value)

    def dispatch(self, claim: Any) -> Any:
        raise NotImplementedError

    def lookup(self, operation: Any, attempts: Any) -> Any:
        raise NotImplementedError


def test_an_action_without_a_schema_takes_any_object_and_is_described_by_its_effect() -> None:
    registry = Registry([_Plain()])
    assert registry.payload_schema("plain.do.v1") == ANY_OBJECT
    assert registry.description("plain.do.v1") == "plain.do.v1 (change to the case, at crm)"
    with pytest.raises(UnknownAction):
        registry.payload_schema("plain.other.v1")


@pytest.mark.parametrize(
    ("extras", "message"),
    [
        ({"payload_schemas": {"plain.else.v1": {"type": "object"}}}, "payload_schemas names"),
        ({"descriptions": {"plain.else.v1": "x"}}, "descriptions names"),
        ({"payload_schemas": {"plain.do.v1": {"type": "string"}}}, "must be a JSON Schema"),
    ],
)
def test_a_schema_or_description_for_an_unserved_action_or_not_an_object_is_refused(
    extras: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Registry([_Plain(**extras)])
