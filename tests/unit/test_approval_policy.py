"""The approval policy's decision (`opledger.ledger.approval_policy`): pure, total, and
exactly what its rules say, over any target and payload."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opledger.ledger.approval_policy import (
    ALWAYS,
    DEFAULT_EXPIRY,
    NEVER,
    parse_policies,
    parse_policy,
    policies_setting,
    requirement,
)
from opledger.ledger.errors import ApprovalPolicyInvalid

ACTION = "stripe.refund.v1"

scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
payloads = st.dictionaries(st.sampled_from(["amount", "to", "note", "x"]), json_values, max_size=4)
targets = st.text(max_size=12)


@given(targets, payloads)
def test_never_asks_nobody_and_always_asks_one_person(target: str, payload: dict[str, Any]) -> None:
    assert requirement(NEVER, target, payload) is None
    assert requirement(parse_policy(ACTION, "never"), target, payload) is None
    needed = requirement(ALWAYS, target, payload)
    assert needed is not None and needed.approvers == 1
    assert needed.expires_after == DEFAULT_EXPIRY


@given(st.integers(-(10**12), 10**12), st.integers(-(10**12), 10**12), targets)
def test_above_holds_exactly_when_the_amount_is_above_the_threshold(
    amount: int, threshold: int, target: str
) -> None:
    policy = parse_policy(ACTION, {"when": [{"field": "amount", "above": threshold}]})
    needed = requirement(policy, target, {"amount": amount})
    assert (needed is not None) == (amount > threshold)
    # a string that reads as the same number is the same number
    assert (requirement(policy, target, {"amount": str(amount)}) is not None) == (
        amount > threshold
    )


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_more_never_needs_less(low: int, extra: int, threshold: int) -> None:
    policy = parse_policy(ACTION, {"when": [{"field": "amount", "above": threshold}]})
    if requirement(policy, "t", {"amount": low}) is not None:
        assert requirement(policy, "t", {"amount": low + extra}) is not None


@given(st.lists(st.text(max_size=3), max_size=12), st.integers(0, 10))
def test_count_above_counts_the_items(recipients: list[str], n: int) -> None:
    policy = parse_policy(ACTION, {"when": [{"field": "to", "count_above": n}]})
    assert (requirement(policy, "t", {"to": recipients}) is not None) == (len(recipients) > n)


@given(st.sampled_from(["ent-1", "ent-", "smb-1", "ENT-1", "x-ent-1"]))
def test_target_matches_is_a_case_sensitive_glob(target: str) -> None:
    policy = parse_policy(ACTION, {"when": [{"target_matches": "ent-*"}]})
    assert (requirement(policy, target, {}) is not None) == target.startswith("ent-")


@given(
    json_values.filter(lambda v: (v is not None and not isinstance(v, int)) or isinstance(v, bool))
)
def test_a_value_that_is_not_a_number_is_asked_about(value: Any) -> None:
    """Fail closed: what the policy cannot compare is never waved through."""
    if isinstance(value, str):
        try:
            float(value)
            return  # a number after all
        except ValueError:
            pass
    policy = parse_policy(ACTION, {"when": [{"field": "amount", "above": 10}]})
    assert requirement(policy, "t", {"amount": value}) is not None


@given(targets, payloads, st.integers(0, 3))
def test_any_rule_holding_is_enough(target: str, payload: dict[str, Any], n: int) -> None:
    one = {"when": [{"field": "amount", "above": 100}]}
    both = {"when": [{"field": "amount", "above": 100}, {"field": "to", "count_above": n}]}
    if requirement(parse_policy(ACTION, one), target, payload) is not None:
        assert requirement(parse_policy(ACTION, both), target, payload) is not None


@given(targets, payloads)
def test_the_decision_is_pure(target: str, payload: dict[str, Any]) -> None:
    policy = parse_policy(
        ACTION,
        [
            {"when": [{"field": "amount", "above": 0}], "approvers": 1},
            {"when": [{"field": "to", "count_above": 1}], "approvers": 2},
        ],
    )
    before = copy.deepcopy(payload)
    first = requirement(policy, target, payload)
    assert requirement(policy, target, payload) == first
    assert payload == before


@given(st.integers(0, 100), st.integers(0, 100))
def test_the_highest_tier_holding_decides(amount: int, recipients: int) -> None:
    policy = parse_policy(
        ACTION,
        [
            {"when": [{"field": "amount", "above": 50}], "expires_after_seconds": 60},
            {"when": [{"field": "to", "count_above": 50}], "approvers": 2},
        ],
    )
    needed = requirement(policy, "t", {"amount": amount, "to": ["a"] * recipients})
    if recipients > 50:
        assert needed is not None and needed.approvers == 2
        assert needed.expires_after == DEFAULT_EXPIRY
    elif amount > 50:
        assert needed is not None and needed.approvers == 1
        assert needed.expires_after == timedelta(seconds=60)
    else:
        assert needed is None


def test_an_absent_field_does_not_hold() -> None:
    policy = parse_policy(ACTION, {"when": [{"field": "amount.value", "above": 1}]})
    assert requirement(policy, "t", {}) is None
    assert requirement(policy, "t", {"amount": {"value": None}}) is None
    assert requirement(policy, "t", {"amount": {"value": 2}}) is not None


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"when": [{"field": "amount", "above": 1}], "approvers": 3}, "approvers is 1 or 2"),
        ({"when": [{"field": "amount", "above": 1}], "approvers": True}, "approvers is 1 or 2"),
        ({"when": []}, '"when"'),
        ({"approvers": 1}, '"when"'),
        ({"when": [{"field": "amount", "above": "10"}]}, "above is a finite number"),
        ({"when": [{"field": "to", "count_above": -1}]}, "count_above is a whole number"),
        ({"when": [{"field": "", "above": 1}]}, "field"),
        ({"when": [{"fields": "a", "above": 1}]}, "a rule is"),
        ({"when": [{"target_matches": []}]}, "target_matches"),
        ({"when": "always", "expires_after_seconds": 0}, "expires_after_seconds"),
        ({"when": "always", "extra": 1}, "unknown key"),
        ("sometimes", "is not a policy"),
        ([], "tiers"),
    ],
)
def test_a_malformed_policy_is_refused_naming_the_action(raw: Any, says: str) -> None:
    with pytest.raises(ApprovalPolicyInvalid) as refused:
        parse_policy(ACTION, raw)
    assert ACTION in str(refused.value) and says in str(refused.value)
    assert refused.value.action == ACTION


def test_a_deployments_policies_inline_or_from_a_file(tmp_path: Any) -> None:
    inline = '{"stripe.refund.v1": "always", "crm.close_case.v1": "never"}'
    assert policies_setting(inline) == {"stripe.refund.v1": ALWAYS, "crm.close_case.v1": NEVER}
    file = tmp_path / "policies.json"
    file.write_text(inline)
    assert policies_setting(str(file)) == policies_setting(inline)
    with pytest.raises(ApprovalPolicyInvalid, match="neither inline JSON nor a readable file"):
        policies_setting(str(tmp_path / "missing.json"))
    with pytest.raises(ApprovalPolicyInvalid, match="not an action"):
        parse_policies({"refund": "always"})
    with pytest.raises(ApprovalPolicyInvalid, match=r"stripe\.refund\.v1"):
        policies_setting('{"stripe.refund.v1": {"when": "always", "approvers": 5}}')
