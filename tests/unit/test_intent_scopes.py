"""How wide an act is (its intent scope): a tenant-wide act's key leaves the run out, has a
form no run's key takes, and is derived in the scope its action declares — the adapter's,
or the deployment's `OPLEDGER_INTENT_SCOPES` — never a caller's choice."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opledger.adapters.crm import CrmAdapter
from opledger.adapters.email import EmailAdapter
from opledger.adapters.registry import Registry, load_registry
from opledger.adapters.stripe import StripeAdapter
from opledger.ledger import InvalidInput
from opledger.ledger.intents import (
    RUN,
    TENANT,
    Intent,
    act_key,
    intent_key,
    parse_scopes,
    tenant_wide,
)
from opledger.settings import Settings, SettingsInvalid

REFUND = "stripe.refund.v1"
targets = st.from_regex(r"(ch|pi)_[A-Za-z0-9]{1,20}", fullmatch=True)
amounts = st.integers(1, 10**8)


def _intent(run: str, **kw: Any) -> Intent:
    args: dict[str, Any] = {
        "tenant": "acme",
        "workflow_id": run,
        "action": REFUND,
        "target": "ch_1",
        "payload": {"amount": 500, "reason": "duplicate"},
        "authorization_ref": "auth_acme",
    }
    args.update(kw)
    return Intent(**args)


def _fields(action: str) -> tuple[str, ...]:
    return ("amount",)


def _tenant(action: str) -> str:
    return TENANT


@given(targets, amounts, st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_a_tenant_wide_act_has_one_key_whatever_run_asks(
    target: str, amount: int, run_a: str, run_b: str
) -> None:
    a = _intent(run_a, target=target, payload={"amount": amount}).keyed(_fields, _tenant)
    b = _intent(run_b, target=target, payload={"amount": amount, "reason": "fraudulent"})
    keyed = b.keyed(_fields, _tenant)
    assert a.intent_key == keyed.intent_key and a.scope == keyed.scope == TENANT
    assert a.intent_key is not None and tenant_wide(a.intent_key)
    assert a.intent_key.startswith(f"{REFUND}:tenant:")
    # another amount is another refund, in the tenant's scope too
    other = _intent(run_a, target=target, payload={"amount": amount + 1}).keyed(_fields, _tenant)
    assert other.intent_key != a.intent_key


@given(targets, amounts, st.sampled_from([None, "second refund"]))
def test_the_scopes_keys_never_meet(target: str, amount: int, purpose: str | None) -> None:
    """The same act's key in the run's scope and in the tenant's: two forms, two digests;
    a run's key keeps the form and value it had before scopes existed."""
    payload = {"amount": amount}
    run = intent_key(REFUND, target, payload, fields=["amount"], purpose=purpose)
    tenant = intent_key(REFUND, target, payload, fields=["amount"], purpose=purpose, scope=TENANT)
    assert not tenant_wide(run) and tenant_wide(tenant)
    assert run.split(":")[-1] != tenant.split(":")[-1]
    assert run == intent_key(REFUND, target, payload, fields=["amount"], purpose=purpose, scope=RUN)
    assert run == act_key(REFUND, target, payload, declared=_fields, purpose=purpose)


def test_a_known_key_stays_what_it_was() -> None:
    """Keys already recorded are found again: the run's derivation did not change (the
    values are what the derivation before scopes gave)."""
    assert intent_key("crm.close_case.v1", "case-318", {"note": "x"}) == (
        "crm.close_case.v1:c5a9b66cb875577382370c12359248dc"
    )
    assert intent_key(REFUND, "ch_1", {"amount": 500}, fields=["amount"], purpose="2") == (
        "stripe.refund.v1:a3f150c1432718003e70df6b6a053f65"
    )


def test_a_purpose_is_a_second_act_in_either_scope() -> None:
    first = _intent("a").keyed(_fields, _tenant)
    second = _intent("a", purpose="second refund").keyed(_fields, _tenant)
    again = _intent("b", purpose="Second  refund").keyed(_fields, _tenant)
    assert second.intent_key != first.intent_key and second.intent_key == again.intent_key


def test_the_scope_is_the_actions_never_the_callers() -> None:
    with pytest.raises(InvalidInput, match="the scope is the action's declaration"):
        _intent("a", scope=RUN).keyed(_fields, _tenant)
    with pytest.raises(InvalidInput, match="the scope is the action's declaration"):
        _intent("a", scope=TENANT).keyed(_fields)  # no declaration: the run's
    with pytest.raises(InvalidInput):
        _intent("a", scope="world").keyed(_fields, _tenant)
    # saying the declared scope is fine; a key of your own names an act of your run
    assert _intent("a", scope=TENANT).keyed(_fields, _tenant).scope == TENANT
    own = _intent("a", intent_key="refund-1").keyed(_fields, _tenant)
    assert (own.intent_key, own.scope) == ("refund-1", None)
    # keyed twice: the same
    once = _intent("a").keyed(_fields, _tenant)
    assert once.keyed(_fields, _tenant) == once


def test_the_bundled_adapters_declare_their_scopes() -> None:
    registry = Registry(
        [
            CrmAdapter("http://127.0.0.1:9", account="acme"),
            EmailAdapter("http://127.0.0.1:9", account="acme"),
            StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123"),
        ]
    )
    scopes = {action: registry.intent_scope(action) for action in registry.actions}
    assert scopes == {
        "crm.close_case.v1": TENANT,
        "crm.update_case.v1": RUN,
        "email.send.v1": RUN,
        "stripe.charge.v1": RUN,
        "stripe.payment_intent.v1": RUN,
        "stripe.refund.v1": TENANT,
    }
    wrong = CrmAdapter("http://127.0.0.1:9", account="acme")
    wrong.intent_scopes = {"crm.refund.v1": TENANT}  # an action it does not serve
    with pytest.raises(ValueError, match="does not serve"):
        Registry([wrong])
    wrong.intent_scopes = {"crm.close_case.v1": "world"}
    with pytest.raises(InvalidInput, match="not an intent scope"):
        Registry([wrong])


def test_a_deployment_sets_an_actions_scope() -> None:
    env = {
        "OPLEDGER_ADAPTERS": "opledger.adapters.defaults:build_registry",
        "OPLEDGER_STRIPE_API_KEY": "sk_test_123",
        "OPLEDGER_INTENT_SCOPES": " stripe.charge.v1=tenant, crm.close_case.v1 = run ,",
    }
    registry = load_registry(Settings.from_environ(env))
    assert registry.intent_scope("stripe.charge.v1") == TENANT
    assert registry.intent_scope("crm.close_case.v1") == RUN
    assert registry.intent_scope("stripe.refund.v1") == TENANT  # the adapter's, untouched
    typo = {**env, "OPLEDGER_INTENT_SCOPES": "stripe.chrage.v1=tenant"}
    with pytest.raises(SettingsInvalid, match=r"no adapter of .* serves"):
        load_registry(Settings.from_environ(typo))


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("stripe.refund.v1", "not action=scope"),
        ("=tenant", "not action=scope"),
        ("stripe.refund.v1=world", "not an intent scope"),
        ("refund=tenant", "not a versioned action"),
        ("stripe.refund.v1=tenant,stripe.refund.v1=run", "given twice"),
    ],
)
def test_a_scope_setting_that_says_nothing_clear_is_refused(text: str, error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        parse_scopes(text)
    with pytest.raises(SettingsInvalid, match=error):
        Settings.from_environ({"OPLEDGER_INTENT_SCOPES": text})
    assert parse_scopes("") == {}
