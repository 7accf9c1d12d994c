"""`opledger approvals` and `opledger operator update --approves`: list, show (the payload
as shown, secrets hidden, and the digest), approve and deny, each refusal one line with
exit 3."""

from __future__ import annotations

import json
from collections.abc import Callable

from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter
from opledger.console.accounts import Accounts
from opledger.ledger import Ledger, Status
from opledger.ledger.intents import Intent
from tests.clirun import Run

REFUND = "stripe.refund.v1"


def test_an_operator_approves_and_denies_what_they_were_shown(
    ledger: Ledger, invoke: Callable[..., Run]
) -> None:
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval(REFUND, "always")
    asking = Ledger(ledger.engine, actions=registry)
    ledger.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_s")
    Accounts(ledger.engine).add("alice", tenants=["acme"], password=None, by="test")
    ops = [
        asking.ask_intent(
            Intent(
                tenant="acme",
                workflow_id="run-1",
                action=REFUND,
                target=f"ch_{n}",
                payload={
                    "amount": 500 + n,
                    "metadata": {"api_key": "sk_live_abcdefghijklmnop1234"},
                },
                authorization_ref="auth_s",
            )
        ).operation
        for n in (1, 2)
    ]
    listed = invoke("approvals", "list", "--tenant", "acme", "--json")
    assert listed.code == 0, listed.err
    assert [a["op_id"] for a in json.loads(listed.out)] == [op.id for op in ops]
    shown = invoke("approvals", "show", ops[0].id)
    assert shown.code == 0, shown.err
    assert ops[0].payload_digest in shown.out and "sk_live_" not in shown.out
    document = json.loads(invoke("approvals", "show", ops[0].id, "--json").out)
    assert document["payload_digest"] == ops[0].payload_digest
    assert "sk_live_" not in json.dumps(document["payload"])

    digest = ops[0].payload_digest
    approve = ("approvals", "approve", ops[0].id, "--operator", "alice", "--digest")
    not_yet = invoke(*approve, digest)  # alice approves nothing yet
    assert not_yet.code == 3 and "may not approve" in not_yet.err
    assert len(not_yet.err.strip().splitlines()) == 1
    updated = invoke("operator", "update", "alice", "--approves", "stripe.*", "--by", "admin")
    assert updated.code == 0 and "approves stripe.*" in updated.out
    stale = invoke(*approve, ops[1].payload_digest)
    assert stale.code == 3 and "look at it again" in stale.err
    done = invoke(*approve, digest, "--note", "checked the charge")
    assert done.code == 0, done.err
    assert "is released" in done.out
    assert ledger.get(ops[0].id).waiting_on == 0
    again = invoke(*approve, digest)
    assert again.code == 3 and "approved" in again.err

    deny = ("approvals", "deny", ops[1].id, "--operator", "alice")
    denied = invoke(*deny, "--digest", ops[1].payload_digest, "--note", "wrong charge")
    assert denied.code == 0, denied.err
    assert ledger.get(ops[1].id).status is Status.CANCELLED
    assert ledger.answer(ops[1].id).last_reason == "denied by alice: wrong charge"
    recorded = json.loads(invoke("approvals", "show", ops[1].id, "--json").out)
    assert [d["decision"] for d in recorded["decisions"]] == ["denied"]
    assert "sk_live_" not in json.dumps(recorded["decisions"])  # the payload as shown
    assert json.loads(invoke("approvals", "list", "--json").out) == []
