"""The console's approval queue, against a real `opledger console` process signed in to
over HTTP: the queue lists only what the operator may approve (a count in the nav), the
approval page shows the act with its payload redacted and the digest it was shown with,
and its forms post that digest back to `Ledger.approve`/`deny`. A page shown before the
payload changed is refused as stale; another tenant's approval is not found; an operator
whose scope does not cover the action, and the asker, are refused; an approval decided
already says so; a form without the session's CSRF token changes nothing.

One console process is shared by the module's tests (each starts from no operator: the
`env` fixture; and from an empty ledger: `ledger`); operators are added through the library
call `opledger operator add` makes."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text

from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.dev.processes import unconfigured_environ
from opledger.ledger import Ledger, Operation, Status
from opledger.ledger.intents import Intent
from tests.consoles import (
    add_operator,
    csrf_of,
    forget_accounts,
    page_client,
    running_console,
    sign_in,
)

REFUND, CHARGE = "stripe.refund.v1", "stripe.charge.v1"
SECRET = "sk_live_abcdefghijklmnop1234"


@pytest.fixture(scope="module")
def console_url(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `opledger console` process with the default options."""
    state = tmp_path_factory.mktemp("approvals-console")
    env = unconfigured_environ() | {
        "OPLEDGER_DATABASE_URL": database_url,
        "OPLEDGER_STATE_DIR": str(state),
    }
    forget_accounts(database_url)
    add_operator(env, "starter", "--tenant", "acme")  # none: it refuses to start
    with running_console(env, state / "console.log", forked=True) as url:
        yield url


@pytest.fixture
def asking(ledger: Ledger, env: dict[str, str]) -> Ledger:
    """A ledger that asks as an agent's would: refunds above 10000 need one person, charges
    above 10000 two. acme's and globex's grants cover Stripe. Operators: alice and bob
    approve Stripe's acts for acme, carol acts for acme but approves nothing, dave approves
    everything for globex, mallory approves Stripe's for acme and asks for acts herself."""
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval(REFUND, {"when": [{"field": "amount", "above": 10000}]})
    registry.require_approval(
        CHARGE, {"when": [{"field": "amount", "above": 10000}], "approvers": 2}
    )
    for tenant in ("acme", "globex"):
        ledger.grant(tenant=tenant, scope=["stripe.*"], granted_by="test", ref=f"auth_{tenant}")
    for name, tenant, approves in (
        ("alice", "acme", "stripe.*"),
        ("bob", "acme", "stripe.refund.v1"),
        ("carol", "acme", None),
        ("dave", "globex", "*"),
        ("mallory", "acme", "stripe.*"),
    ):
        add_operator(env, name, "--tenant", tenant, *(("--approves", approves) if approves else ()))
    return Ledger(ledger.engine, actions=registry)


@pytest.fixture
def client(console_url: str) -> Iterator[httpx.Client]:
    with page_client(console_url) as c:
        yield c


def refund(
    ledger: Ledger, amount: int, *, tenant: str = "acme", target: str = "ch_1", actor: str = "agent"
) -> Operation:
    intent = Intent(
        tenant=tenant,
        workflow_id="run-1",
        action=REFUND,
        target=target,
        payload={"amount": amount, "reason": "duplicate", "metadata": {"api_key": SECRET}},
        authorization_ref=f"auth_{tenant}",
        asked_by="call-1",
    )
    return ledger.ask_intent(intent, actor=actor).operation


def page_of(op: Operation) -> str:
    return f"/t/{op.tenant}/ops/{op.id}/approval"


def shown_digest(page: httpx.Response) -> str:
    found = re.search(r'name="digest" value="([0-9a-f]+)"', page.text)
    assert found is not None, page.text
    return found.group(1)


def decide(
    client: httpx.Client, op: Operation, how: str, note: str = "", **fields: str
) -> httpx.Response:
    """Open the approval page and post its `how` form (approve or deny) as a browser does."""
    page = client.get(page_of(op))
    assert page.status_code == 200, page.text
    data = {"csrf_token": csrf_of(page), "digest": shown_digest(page), "note": note} | fields
    return client.post(f"/t/{op.tenant}/ops/{op.id}/{how}", data=data)


def refusal(answer: httpx.Response) -> str:
    return html.unescape(answer.text.split('id="refusal">')[1].split("</p>")[0])


def relayed(ledger: Ledger) -> list[str]:
    published: list[str] = []
    ledger.relay(older_than=timedelta(0), publish=lambda op_id, gen: published.append(op_id))
    return published


def test_the_queue_lists_what_the_operator_may_approve_and_the_nav_counts_it(
    asking: Ledger, client: httpx.Client
) -> None:
    big = refund(asking, 25_000)
    refund(asking, 500, target="ch_2")  # below the threshold: nobody is asked
    other = refund(asking, 40_000, tenant="globex")
    assert sign_in(client, "alice").status_code == 303
    queue = client.get("/approvals")
    assert queue.status_code == 200
    assert re.findall(r'class="approval-row" data-op="([^"]+)"', queue.text) == [big.id]
    assert "amount 25000 is above 10000" in queue.text
    assert 'id="approvals-waiting">1<' in client.get("/").text  # on every page's nav

    assert sign_in(client, "dave").status_code == 303  # globex's approver
    rows = re.findall(r'class="approval-row" data-op="([^"]+)"', client.get("/approvals").text)
    assert rows == [other.id]
    assert sign_in(client, "carol").status_code == 303  # acts for acme, approves nothing
    nothing = client.get("/approvals").text
    assert "approval-row" not in nothing and "You approve nothing" in nothing
    assert "approvals-waiting" not in nothing


def test_the_approval_page_shows_the_act_with_its_payload_redacted_and_its_digest(
    asking: Ledger, client: httpx.Client
) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "alice").status_code == 303
    page = client.get(page_of(op))
    assert page.status_code == 200, page.text
    shown = html.unescape(page.text)
    for fact in (REFUND, "ch_1", "auth_acme", "amount 25000 is above 10000", "no decision yet"):
        assert fact in shown, fact
    assert SECRET not in shown and '"amount": 25000' in shown
    assert "metadata.api_key" in shown or "[hidden" in shown
    assert shown_digest(page) == op.payload_digest
    assert f'id="digest">{op.payload_digest}<' in page.text


def test_an_approval_posts_the_digest_shown_and_releases_the_act_once(
    asking: Ledger, client: httpx.Client
) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "alice").status_code == 303
    assert asking.claim(op.id, owner="w") is None  # it waits
    # a forged operator field is ignored: the decision is the session's operator's
    done = decide(client, op, "approve", "checked the charge", operator="mallory")
    assert done.status_code == 303 and done.headers["location"] == page_of(op)
    after = client.get(page_of(op))
    assert "is released and will be sent once" in after.text
    assert "nothing is left to decide" in after.text and 'id="approve-form"' not in after.text
    [decision] = asking.approval_decisions(op.id)
    assert (decision.operator, decision.decision, decision.note) == (
        "alice",
        "approved",
        "checked the charge",
    )
    assert decision.payload_digest == op.payload_digest and SECRET not in str(decision.shown)
    assert relayed(asking) == [op.id]
    assert asking.claim(op.id, owner="w1") is not None
    assert asking.claim(op.id, owner="w2") is None
    # decided already: the page's form, posted again, says so
    again = client.post(
        f"/t/acme/ops/{op.id}/approve",
        data={"csrf_token": csrf_of(after), "digest": op.payload_digest},
    )
    assert again.status_code == 409 and "already decided" in again.text
    assert len(asking.approval_decisions(op.id)) == 1


def test_a_page_shown_before_the_payload_or_grant_changed_is_refused_as_stale(
    asking: Ledger, client: httpx.Client
) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "alice").status_code == 303
    page = client.get(page_of(op))
    # the act is bound to another payload since the page was shown
    other = "0" * 64
    with asking.engine.begin() as conn:
        for table, key in (("operations", "id"), ("approvals", "op_id")):
            conn.execute(
                text(f"UPDATE {table} SET payload_digest = :d WHERE {key} = :id"),
                {"d": other, "id": op.id},
            )
    form = {"csrf_token": csrf_of(page), "digest": shown_digest(page), "note": "looks fine"}
    for how in ("approve", "deny"):
        stale = client.post(f"/t/acme/ops/{op.id}/{how}", data=form)
        assert stale.status_code == 409, how
        assert "this act changed since you opened it" in stale.text
        assert "look at it again" in refusal(stale)
        assert f'id="open-again" href="{page_of(op)}"' in stale.text
    assert asking.approval(op.id).status == "pending" and asking.approval_decisions(op.id) == ()
    # looking again shows the digest it is bound to now
    assert shown_digest(client.get(page_of(op))) == other

    # another act, whose operation is under another grant since its page was shown
    moved = refund(asking, 30_000, target="ch_2")
    page = client.get(page_of(moved))
    asking.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_acme_2")
    with asking.engine.begin() as conn:
        conn.execute(
            text("UPDATE operations SET authorization_ref = 'auth_acme_2' WHERE id = :id"),
            {"id": moved.id},
        )
    form = {"csrf_token": csrf_of(page), "digest": shown_digest(page)}
    stale = client.post(f"/t/acme/ops/{moved.id}/approve", data=form)
    assert stale.status_code == 409 and "this act changed since you opened it" in stale.text
    assert asking.approval(moved.id).approved_by == ()


def test_another_tenants_approval_is_not_found(asking: Ledger, client: httpx.Client) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "dave").status_code == 303
    token = csrf_of(client.get("/approvals"))
    for path in (page_of(op), f"/t/globex/ops/{op.id}/approval"):
        assert client.get(path).status_code == 404, path
    for tenant in ("acme", "globex"):
        posted = client.post(
            f"/t/{tenant}/ops/{op.id}/approve",
            data={"csrf_token": token, "digest": op.payload_digest},
        )
        assert posted.status_code == 404 and refusal(posted) == "not found"
    assert asking.approval(op.id).approved_by == ()


def test_an_operator_whose_scope_does_not_cover_the_action_is_refused(
    asking: Ledger, client: httpx.Client
) -> None:
    op = asking.prepare(
        tenant="acme",
        workflow_id="run-1",
        intent_key="charge-1",
        action=CHARGE,
        target="order-1",
        payload={"amount": 50_000, "currency": "usd", "source": "tok_visa"},
        authorization_ref="auth_acme",
    )
    assert sign_in(client, "bob").status_code == 303  # approves refunds only
    assert op.id not in client.get("/approvals").text
    page = client.get(page_of(op))
    assert page.status_code == 403 and "may not approve stripe.charge.v1" in refusal(page)
    token = csrf_of(client.get("/approvals"))
    posted = client.post(
        f"/t/acme/ops/{op.id}/approve", data={"csrf_token": token, "digest": op.payload_digest}
    )
    assert posted.status_code == 403 and "may not approve" in refusal(posted)
    # two people approve a charge: the first is told it waits, the same person again is
    # refused, the second releases it
    assert sign_in(client, "alice").status_code == 303
    assert decide(client, op, "approve").status_code == 303
    assert "waits for 1 more approval(s)" in client.get(page_of(op)).text
    twice = decide(client, op, "approve")
    assert twice.status_code == 409 and "already approved by you" in twice.text
    assert sign_in(client, "mallory").status_code == 303
    assert decide(client, op, "approve").status_code == 303
    assert asking.approval(op.id).approved_by == ("alice", "mallory")
    assert asking.get(op.id).waiting_on == 0


def test_the_asker_cannot_approve_and_a_revoked_grant_is_refused(
    asking: Ledger, client: httpx.Client
) -> None:
    op = refund(asking, 25_000, actor="mallory")
    assert sign_in(client, "mallory").status_code == 303
    own = decide(client, op, "approve")
    assert own.status_code == 403 and "the asker never approves" in refusal(own)
    assert sign_in(client, "alice").status_code == 303
    asking.revoke("auth_acme", by="test", reason="card reported stolen")
    revoked = decide(client, op, "approve")
    assert revoked.status_code == 409 and "no longer active" in refusal(revoked)
    assert asking.approval(op.id).approved_by == ()


def test_a_denial_cancels_the_act_with_its_reason(asking: Ledger, client: httpx.Client) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "alice").status_code == 303
    why = decide(client, op, "deny", "")
    assert why.status_code == 400 and "a denial says why" in refusal(why)
    assert decide(client, op, "deny", "wrong customer").status_code == 303
    assert "Denied:" in client.get(page_of(op)).text
    assert asking.get(op.id).status is Status.CANCELLED
    assert asking.answer(op.id).last_reason == "denied by alice: wrong customer"
    assert op.id not in client.get("/approvals").text


def test_a_form_without_the_sessions_csrf_token_changes_nothing(
    asking: Ledger, client: httpx.Client
) -> None:
    op = refund(asking, 25_000)
    assert sign_in(client, "alice").status_code == 303
    for how in ("approve", "deny"):
        for token in ({}, {"csrf_token": "forged"}):
            posted = client.post(
                f"/t/acme/ops/{op.id}/{how}",
                data={"digest": op.payload_digest, "note": "no"} | token,
            )
            assert posted.status_code == 403 and "CSRF" in refusal(posted)
    assert asking.approval(op.id).status == "pending" and asking.approval_decisions(op.id) == ()
    assert asking.get(op.id).status is Status.PREPARED
