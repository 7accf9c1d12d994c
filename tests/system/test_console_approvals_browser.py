"""The console's approval queue in a real browser (Debian's Chromium, headless, via its
chromedriver), served by a real `opledger console` process: an operator signs in, sees the
pending refund counted in the nav and listed, opens it (the frozen payload with its secret
hidden, the digest), approves it, and the refund is released: relayed and claimable once.
An operator of the same tenant whose scope does not cover refunds never sees it; a denial
cancels the act with its reason, the one the agent reads.

The refunds are asked as an agent asks (`ask_intent`) by a ledger whose Stripe adapter's
policy asks a person about refunds above 10000; nothing is sent to Stripe: the release is
checked on the ledger (the relay, the claim)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.dev.processes import unconfigured_environ
from opledger.ledger import Ledger, Operation, Status
from opledger.ledger.intents import Intent
from tests.conftest import truncate_all
from tests.consoles import (
    add_operator,
    browser_sign_in,
    chromium,
    forget_accounts,
    running_console,
)

if TYPE_CHECKING:  # the browser tests import Selenium only once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.system

REFUND = "stripe.refund.v1"
SECRET = "sk_live_abcdefghijklmnop1234"


@dataclass
class Console:
    url: str
    ledger: Ledger  #: asks as an agent's would: refunds above 10000 wait for a person


@pytest.fixture(scope="module")
def console(
    session_ledger: Ledger, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Console]:
    """A console process; alice approves acme's Stripe acts, carol acts for acme but
    approves nothing."""
    truncate_all(database_url)
    forget_accounts(database_url)
    state = tmp_path_factory.mktemp("approvals-browser")
    env = unconfigured_environ() | {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_STATE_DIR": str(state),
    }
    add_operator(env, "alice", "--tenant", "acme", "--approves", "stripe.*")
    add_operator(env, "carol", "--tenant", "acme")
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval(REFUND, {"when": [{"field": "amount", "above": 10000}]})
    asking = Ledger(session_ledger.engine, actions=registry)
    asking.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_acme")
    with running_console(env, state / "console.log", forked=True) as url:
        yield Console(url, asking)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def refund(console: Console, target: str, amount: int = 25_000) -> Operation:
    intent = Intent(
        tenant="acme",
        workflow_id="support-7",
        action=REFUND,
        target=target,
        payload={"amount": amount, "reason": "duplicate", "metadata": {"api_key": SECRET}},
        authorization_ref="auth_acme",
    )
    return console.ledger.ask_intent(intent, actor="support-agent").operation


def relayed(ledger: Ledger) -> list[str]:
    published: list[str] = []
    ledger.relay(older_than=timedelta(0), publish=lambda op_id, gen: published.append(op_id))
    return published


def open_from_queue(d: WebDriver, op: Operation) -> None:
    from selenium.webdriver.common.by import By

    d.find_element(By.ID, "nav-approvals").click()
    d.find_element(By.CSS_SELECTOR, f"tr[data-op='{op.id}'] a.op-link").click()
    assert d.find_element(By.ID, "op-id").text == op.id


def test_an_approver_sees_the_pending_refund_approves_it_and_it_is_released_once(
    browser: WebDriver, console: Console, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op = refund(console, "ch_approve")
    assert console.ledger.claim(op.id, owner="w0") is None  # it waits for a person
    assert relayed(console.ledger) == []

    browser_sign_in(d, console.url, "carol")  # acme's operator, approves nothing
    # (an absence is read from what is there: a lookup of what is not waits for it)
    assert d.find_element(By.ID, "nav-approvals").text == "approvals"  # no count
    d.find_element(By.ID, "nav-approvals").click()
    assert op.id not in d.find_element(By.ID, "approvals").text
    d.get(f"{console.url}/t/acme/ops/{op.id}/approval")
    assert d.find_element(By.ID, "refusal-title").text == "refused"

    browser_sign_in(d, console.url, "alice")
    assert d.find_element(By.ID, "approvals-waiting").text == "1"
    open_from_queue(d, op)
    assert d.find_element(By.ID, "action").text == REFUND
    assert d.find_element(By.ID, "grant").text == "auth_acme"
    assert "amount 25000 is above 10000" in d.find_element(By.ID, "reasons").text
    payload = d.find_element(By.ID, "payload").text
    assert '"amount": 25000' in payload and SECRET not in payload
    assert d.find_element(By.ID, "digest").text == op.payload_digest
    # a forged operator field is ignored: the decision is the signed-in operator's
    d.execute_script(
        "const f = document.getElementById('approve-form');"
        "const i = document.createElement('input');"
        "i.type = 'hidden'; i.name = 'operator'; i.value = 'mallory'; f.appendChild(i);"
    )
    d.find_element(By.ID, "approve-note").send_keys("checked the duplicate charge")
    d.find_element(By.ID, "approve").click()
    assert "is released and will be sent once" in d.find_element(By.ID, "decided").text
    row = d.find_element(By.CSS_SELECTOR, "#decisions tr.decision-row")
    assert row.find_element(By.CSS_SELECTOR, ".operator").text == "alice"
    assert row.find_element(By.CSS_SELECTOR, ".decision").text == "approved"
    assert "nothing is left to decide" in d.find_element(By.ID, "closed").text
    assert d.find_element(By.ID, "nav-approvals").text == "approvals"  # none waits now

    # released: the relay publishes it once, and it is claimed once
    assert relayed(console.ledger) == [op.id]
    claim = console.ledger.claim(op.id, owner="w1")
    assert claim is not None
    assert console.ledger.claim(op.id, owner="w2") is None
    approval = console.ledger.approval(op.id)
    assert (approval.approved_by, approval.consumed_fence) == (("alice",), claim.fence)


def test_a_denial_cancels_the_refund_with_its_reason(browser: WebDriver, console: Console) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op = refund(console, "ch_deny")
    browser_sign_in(d, console.url, "alice")
    open_from_queue(d, op)
    d.find_element(By.ID, "deny-note").send_keys("wrong customer")
    d.find_element(By.ID, "deny").click()
    assert "Denied" in d.find_element(By.ID, "decided").text
    assert "denied by alice: wrong customer" in d.find_element(By.ID, "operation-status").text
    assert console.ledger.get(op.id).status is Status.CANCELLED
    assert console.ledger.answer(op.id).last_reason == "denied by alice: wrong customer"
    assert relayed(console.ledger) == [] and console.ledger.claim(op.id, owner="w") is None
    d.find_element(By.ID, "nav-approvals").click()
    assert op.id not in d.find_element(By.ID, "approvals").text
