"""What the console's review and operation pages show of a payload, a provider's response,
evidence details and results: every secret hidden, by name and by shape, and the fields
`--redact` names. A real `opledger console` process, signed in to over HTTP."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from opledger.ledger import Ambiguous, Ledger
from tests.consoles import add_operator, console_client, sign_in
from tests.leaks import CLEAR, SECRETS, SHAPES


def _in_review(ledger: Ledger, grant: str) -> str:
    """An operation in review whose payload, attempt response, evidence detail and result
    document each hold every example and every shape."""
    secrets = SECRETS | SHAPES
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf-pages",
        intent_key="pages",
        action="crm.close_case.v1",
        target="case-7",
        payload={"note": "shown", "customer": {"email": "ann@example.com"}, **secrets},
        authorization_ref=grant,
    )
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    after = ledger.record_outcome(
        claim, Ambiguous(code="bad_gateway", reason="502", detail={"body": secrets})
    )
    ledger.record_evidence(
        op.id,
        source="lookup",
        verdict="inconclusive",
        detail={
            "request": {"headers": SECRETS["headers"]},
            "result": {"customer": {"email": "ann@example.com"}, **secrets},
        },
    )
    # a reason may quote what a provider said: free text, scrubbed where it is shown
    said = f"the response was lost; the provider said {SHAPES['b']} for {SHAPES['d']}"
    assert ledger.open_review(op.id, fence=after.fence, reason=f"{said}, card {SHAPES['a']}")
    return op.id


@pytest.mark.parametrize("rule_from", ["--redact", "OPLEDGER_REDACT"])
def test_the_review_and_operation_pages_hide_every_secret(
    ledger: Ledger, grant: str, env: dict[str, str], tmp_path: Path, rule_from: str
) -> None:
    op_id = _in_review(ledger, grant)
    digest = ledger.get(op_id).payload_digest
    add_operator(env, "alice", "--tenant", "acme")
    rule = "crm.*=customer.email"
    if rule_from == "--redact":
        started = console_client(env, tmp_path / "c.log", "--redact", rule)
    else:  # the setting the CLI reads too
        started = console_client(env | {"OPLEDGER_REDACT": rule}, tmp_path / "c.log")
    with started as client:
        assert sign_in(client, "alice").status_code == 303
        queue = html.unescape(client.get("/").text)
        assert "the response was lost; the provider said" in queue
        assert [c for c in CLEAR if c in queue] == []
        for url in (f"/t/acme/ops/{op_id}/review", f"/t/acme/ops/{op_id}"):
            page = client.get(url)
            assert page.status_code == 200, page.text
            text = html.unescape(page.text)
            assert [c for c in CLEAR if c in text] == [], url
            assert "ann@example.com" not in text, url  # --redact, in the payload and results
            assert digest in text  # what was sent can still be compared
            # each hidden by what it is and how big: in the payload, the attempt's response,
            # the dispatch evidence's detail and the lookup's result (and its request)
            assert text.count('"pan": "[hidden: text, 12 characters]"') == 4, url
            assert text.count('"a": "[hidden card number: text, 19 characters]"') == 4, url
            assert text.count('"X-Api-Key": "[hidden: text, 18 characters]"') == 5, url
            assert '"Accept": "application/json"' in text and '"note": "shown"' in text
            hidden = text.split('id="hidden-fields">')[1].split("<")[0]
            assert {"card.number", "cardNumber", "headers.X-Api-Key", "pan", "customer.email"} <= {
                h.strip() for h in hidden.split(",")
            }
