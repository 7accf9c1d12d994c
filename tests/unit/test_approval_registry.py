"""Approval policies in the adapter registry: declared per action by an adapter, checked
when it is registered, overridden per action by `OPLEDGER_APPROVAL_POLICIES`."""

from __future__ import annotations

import pytest

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.registry import Registry, load_registry
from opledger.ledger.approval_policy import ALWAYS, NEVER, parse_policy
from opledger.ledger.errors import ApprovalPolicyInvalid
from opledger.settings import Settings, SettingsInvalid

ENV = {
    "OPLEDGER_ADAPTERS": "opledger.adapters.defaults:build_registry",
    "OPLEDGER_STRIPE_API_KEY": "sk_test_123",
}
BIG = {"when": [{"field": "amount", "above": 10000}], "approvers": 2}


def test_an_adapter_declares_its_policies_checked_when_registered() -> None:
    crm = CrmAdapter("http://127.0.0.1:9", account="acme")
    crm.approval_policies = {"crm.close_case.v1": "always"}  # type: ignore[attr-defined]
    registry = Registry([crm])
    assert registry.approval_policy("crm.close_case.v1") == ALWAYS
    assert registry.approval_policy("crm.update_case.v1") == NEVER  # the default
    crm.approval_policies = {"crm.refund.v1": "always"}  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="does not serve"):
        Registry([crm])
    crm.approval_policies = {"crm.close_case.v1": {"when": "always", "approvers": 3}}  # type: ignore[attr-defined]
    with pytest.raises(ApprovalPolicyInvalid, match=r"crm\.close_case\.v1: approvers is 1 or 2"):
        Registry([crm])


def test_a_deployment_sets_an_actions_policy_inline_or_from_a_file(tmp_path: object) -> None:
    inline = '{"stripe.refund.v1": {"when": [{"field": "amount", "above": 10000}], "approvers": 2}}'
    registry = load_registry(Settings.from_environ({**ENV, "OPLEDGER_APPROVAL_POLICIES": inline}))
    assert registry.approval_policy("stripe.refund.v1") == parse_policy("stripe.refund.v1", BIG)
    assert registry.approval_policy("stripe.charge.v1") == NEVER
    typo = {**ENV, "OPLEDGER_APPROVAL_POLICIES": '{"stripe.refnud.v1": "always"}'}
    with pytest.raises(SettingsInvalid, match=r"no adapter of .* serves"):
        load_registry(Settings.from_environ(typo))
    with pytest.raises(SettingsInvalid, match="approvers is 1 or 2"):
        zero = '{"stripe.refund.v1": {"when": "always", "approvers": 0}}'
        Settings.from_environ({"OPLEDGER_APPROVAL_POLICIES": zero})
    with pytest.raises(SettingsInvalid, match="neither inline JSON nor a readable file"):
        Settings.from_environ({"OPLEDGER_APPROVAL_POLICIES": "/nonexistent/policies.json"})
