"""What `opledger ops show`, `review show` and `review audit` print of payloads, provider
responses, evidence details and results: secrets hidden by name and by shape, text and
--json alike, and more per action with `OPLEDGER_REDACT`. Against the test Postgres."""

from __future__ import annotations

from collections.abc import Callable

from opledger.ledger import Ambiguous, Ledger
from tests.clirun import Run
from tests.leaks import CLEAR, SECRETS, SHAPES


def _secret_review(ledger: Ledger, grant: str) -> str:
    """An operation in review whose payload, attempt response, evidence detail and result
    document hold every example and every shape."""
    secrets = SECRETS | SHAPES
    op = ledger.prepare(
        tenant="acme",
        workflow_id="wf-redact",
        intent_key="redact",
        action="crm.close_case.v1",
        target="case-9",
        payload={"note": "shown", "customer": {"email": "ann@example.com"}, **secrets},
        authorization_ref=grant,
    )
    claim = ledger.claim(op.id, owner="w1")
    assert claim is not None
    outcome = Ambiguous(code="bad_gateway", reason="502", detail={"body": secrets})
    after = ledger.record_outcome(claim, outcome)
    ledger.record_evidence(
        op.id,
        source="lookup",
        verdict="inconclusive",
        detail={
            "request": {"headers": SECRETS["headers"]},
            "result": {"customer": {"email": "ann@example.com"}, **secrets},
        },
    )
    # a reason may quote what a provider said: free text, scrubbed wherever it is shown
    said = f"the response was lost; the provider said {SHAPES['b']} for {SHAPES['d']}"
    assert ledger.open_review(op.id, fence=after.fence, reason=f"{said}, card {SHAPES['a']}")
    return op.id


def _in_clear(text: str) -> list[str]:
    return [c for c in CLEAR if c in text]


def test_ops_show_hides_every_secret_in_responses_details_and_snapshots(
    ledger: Ledger, grant: str, invoke: Callable[..., Run]
) -> None:
    op_id = _secret_review(ledger, grant)
    document = invoke("ops", "show", op_id, "--json")
    assert document.code == 0, document.err
    assert _in_clear(document.out) == [], document.out
    shown = document.json()
    body = shown["attempts"][0]["response"]["detail"]["body"]  # the outcome, as recorded
    assert body["headers"] == {
        "X-Api-Key": "[hidden: text, 18 characters]",
        "Accept": "application/json",
    }
    assert body["card"] == {"number": "[hidden: text, 20 characters]", "exp": "12/30"}
    assert body["a"] == "[hidden card number: text, 19 characters]"
    assert [e["proves"] for e in shown["evidence"]] == ["unknown", "unknown"]  # still judged
    assert shown["operation"]["payload_digest"] == ledger.get(op_id).payload_digest
    table = invoke("ops", "show", op_id)
    assert table.code == 0, table.err
    assert _in_clear(table.out) == [] and "[hidden" in table.out, table.out


def test_review_show_and_audit_hide_every_secret_and_the_setting_adds_rules(
    ledger: Ledger, grant: str, invoke: Callable[..., Run]
) -> None:
    op_id = _secret_review(ledger, grant)
    who = ("--tenant", "acme", "--operator", "alice")
    text = invoke("review", "show", op_id, *who)
    assert text.code == 0, text.err
    assert _in_clear(text.out) == [], text.out
    assert '"pan": "[hidden: text, 12 characters]"' in text.out
    assert "ann@example.com" in text.out  # no rule hides it yet
    # the reason, free text quoting the provider, in the list too (text and --json)
    assert "the provider said" in text.out
    for listed in (
        invoke("review", "list", *who[:2]),
        invoke("review", "list", *who[:2], "--json"),
    ):
        assert listed.code == 0, listed.err
        assert "the provider said" in listed.out and _in_clear(listed.out) == [], listed.out

    ruled = invoke("review", "show", op_id, *who, "--json", OPLEDGER_REDACT="crm.*=customer.email")
    assert ruled.code == 0, ruled.err
    assert _in_clear(ruled.out) == [] and "ann@example.com" not in ruled.out
    document = ruled.json()
    assert document["payload"]["note"] == "shown"
    assert document["payload"]["customer"] == {"email": "[hidden: text, 15 characters]"}
    assert {"customer.email", "card.number", "headers.X-Api-Key", "a", "g"} <= set(
        document["hidden"]
    )
    # and the action's rules reach the provider's result documents
    result = document["evidence"][-1]["detail"]["result"]
    assert result["customer"] == {"email": "[hidden: text, 15 characters]"}
    assert result["pan"] == "[hidden: text, 12 characters]"

    ledger.reviews.resolve(op_id, tenant="acme", operator="alice", resolution="cancel", note="n")
    audit = invoke("review", "audit", op_id, "--tenant", "acme", "--json")
    assert audit.code == 0, audit.err
    assert _in_clear(audit.out) == [], audit.out
    assert audit.json()[0]["shown"]["attempts"][0]["response"]["code"] == "bad_gateway"


def test_a_malformed_redact_setting_is_one_line(ledger: Ledger, invoke: Callable[..., Run]) -> None:
    refused = invoke("ops", "list", OPLEDGER_REDACT="crm.*=note;crm.*")
    assert refused.code == 4
    assert refused.err.strip().splitlines() == [
        "opledger: OPLEDGER_REDACT: redaction rule 'crm.*': use ACTION=field[,field...], e.g. "
        "'crm.*=note,customer.email' (got 'crm.*=note;crm.*') (--debug shows the traceback)"
    ]
