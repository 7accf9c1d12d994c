"""The intent of an agent's effect: the same act asked again (other wording, any new id)
has the same key; another target, intent field value or purpose has another."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from opledger.ledger import InvalidIdentifier, InvalidInput, PayloadNotCanonicalizable
from opledger.ledger.ids import check_key
from opledger.ledger.intents import (
    Intent,
    intent_key,
    intent_values,
    normal_purpose,
    payload_differences,
)

json_scalars = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
names = st.text(st.characters(categories=["Ll"]), min_size=1, max_size=8)
payloads = st.dictionaries(names, json_values, max_size=5)
targets = st.from_regex(r"[a-z][a-z0-9@.-]{0,30}", fullmatch=True)
ACTION = "email.send.v1"


@given(targets, payloads, payloads, st.lists(names, max_size=3))
def test_wording_outside_the_intent_fields_never_changes_the_key(
    target: str, a: dict[str, Any], b: dict[str, Any], fields: list[str]
) -> None:
    """Two payloads that agree on the intent fields are one act, whatever else differs."""
    for name in fields:
        b[name] = a.get(name)
    key = intent_key(ACTION, target, a, fields=fields)
    assert key == intent_key(ACTION, target, b, fields=fields)
    assert key.startswith(f"{ACTION}:") and len(key) <= 200 and check_key("k", key) == key


@given(targets, payloads, names, json_values, json_values)
def test_another_value_of_an_intent_field_is_another_act(
    target: str, payload: dict[str, Any], field: str, one: Any, other: Any
) -> None:
    assume(one is not None and other is not None)
    assume(intent_values({"v": one}, ["v"]) != intent_values({"v": other}, ["v"]))
    a, b = {**payload, field: one}, {**payload, field: other}
    assert intent_key(ACTION, target, a, fields=[field]) != intent_key(
        ACTION, target, b, fields=[field]
    )


@given(targets, targets, payloads)
def test_another_target_or_action_is_another_act(a: str, b: str, payload: dict[str, Any]) -> None:
    assume(a != b)
    assert intent_key(ACTION, a, payload) != intent_key(ACTION, b, payload)
    assert intent_key(ACTION, a, payload) != intent_key("email.send.v2", a, payload)


@given(targets, payloads, st.text(st.characters(categories=["L", "N", "P", "Zs"]), max_size=40))
def test_a_purpose_makes_a_deliberate_repeat_and_names_it_loosely(
    target: str, payload: dict[str, Any], purpose: str
) -> None:
    assume(normal_purpose(purpose) is not None)
    plain = intent_key(ACTION, target, payload)
    repeat = intent_key(ACTION, target, payload, purpose=purpose)
    assert repeat != plain
    # the case and the spacing of a purpose name the same act
    assert intent_key(ACTION, target, payload, purpose=f"  {purpose.upper()} ") == (
        intent_key(ACTION, target, payload, purpose=purpose.upper())
    )


def test_absent_null_and_undeclared_fields_are_alike() -> None:
    """Declaring an optional intent field later keeps the intents already recorded."""
    base = intent_key(ACTION, "a@x.test", {"to": "a@x.test"})
    assert intent_key(ACTION, "a@x.test", {"to": "a@x.test"}, fields=["template"]) == base
    assert intent_key(ACTION, "a@x.test", {"template": None}, fields=["template"]) == base
    assert intent_key(ACTION, "a@x.test", {"template": "t1"}, fields=["template"]) != base
    assert intent_key(ACTION, "a@x.test", {}, purpose="   ") == base  # an empty purpose


def test_dotted_fields_reach_nested_values_and_numbers_compare_canonically() -> None:
    one = {"amount": {"value": 10, "currency": "EUR"}, "memo": "x"}
    same = {"amount": {"value": 10.0, "currency": "EUR"}, "memo": "y"}
    other = {"amount": {"value": 11, "currency": "EUR"}, "memo": "x"}
    fields = ["amount.value", "amount.currency"]
    assert intent_key("pay.charge.v1", "cus_1", one, fields=fields) == intent_key(
        "pay.charge.v1", "cus_1", same, fields=fields
    )
    assert intent_key("pay.charge.v1", "cus_1", one, fields=fields) != intent_key(
        "pay.charge.v1", "cus_1", other, fields=fields
    )
    assert payload_differences(one, same) == ("memo",)
    assert payload_differences({"a": 1}, {"a": 1.0, "b": None}) == ("b",)


def test_a_purpose_is_compared_without_case_or_spacing() -> None:
    one = intent_key(ACTION, "t", {}, purpose="Second Reminder")
    assert one == intent_key(ACTION, "t", {}, purpose="  second   reminder ")
    assert one != intent_key(ACTION, "t", {}, purpose="third reminder")


def test_nfc_and_nfd_spellings_are_one_act() -> None:
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert intent_key(ACTION, nfc, {}) == intent_key(ACTION, nfd, {})
    assert intent_key(ACTION, "t", {}, purpose=nfc) == intent_key(ACTION, "t", {}, purpose=nfd)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"fields": "to"}, InvalidInput),  # one string, not a list of names
        ({"fields": ["to", ""]}, InvalidInput),
        ({"fields": ["amount..value"]}, InvalidInput),
        ({"purpose": "second\u200breminder"}, InvalidIdentifier),
        ({"purpose": "x" * 121}, InvalidIdentifier),
        ({"purpose": 2}, InvalidInput),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        intent_key(ACTION, "a@x.test", {"to": "a@x.test"}, **kwargs)


def test_bad_actions_targets_and_values_are_refused() -> None:
    with pytest.raises(InvalidInput):
        intent_key("send", "a", {})
    with pytest.raises(InvalidIdentifier):
        intent_key(ACTION, "a\u200b", {})
    with pytest.raises(PayloadNotCanonicalizable):
        intent_key(ACTION, "a", {"amount": float("nan")}, fields=["amount"])


class _Declares:
    """An action resolver's `intent_fields`, counting what it was asked."""

    def __init__(self, *fields: str) -> None:
        self.fields, self.asked = fields, list[str]()

    def __call__(self, action: str) -> tuple[str, ...]:
        self.asked.append(action)
        return self.fields


def test_an_intent_record_is_keyed_by_its_act_or_by_its_own_key() -> None:
    act = Intent(
        tenant="acme",
        workflow_id="run-1",
        action=ACTION,
        target="a@x.test",
        payload={"to": "a@x.test", "subject": "hi"},
        authorization_ref="auth_acme",
        purpose="second reminder",
    )
    declared = _Declares("subject")
    keyed = act.keyed(declared)
    assert keyed.intent_key == intent_key(
        ACTION, "a@x.test", act.payload, fields=["subject"], purpose="second reminder"
    )
    assert keyed.purpose is None and keyed.tenant == "acme" and keyed.payload == act.payload
    assert keyed.keyed(declared) == keyed  # the key holds the purpose and fields now
    assert declared.asked == [ACTION]
    given = replace(act, purpose=None, intent_fields=["to"])
    assert given.keyed(_Declares("subject")).intent_key == intent_key(
        ACTION, "a@x.test", act.payload, fields=["to"]
    )
    own = replace(act, purpose=None, intent_key="close-1")
    undeclared = _Declares()
    assert own.keyed(undeclared) is own and undeclared.asked == []
    with pytest.raises(InvalidInput, match="not both"):
        replace(own, purpose="again").keyed(undeclared)
