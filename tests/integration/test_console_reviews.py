"""What the console added to `ledger.reviews`: counts, a reason filter, tenant-scoped search,
history and payload, and a stale view that says what changed (the CLI shows it too)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from opledger.cli.main import app as cli
from opledger.ledger import OperationNotFound, StaleView
from opledger.ledger.errors import InvalidInput
from opledger.settings import get_settings
from tests.desks import Desk


def test_counts_reason_filter_and_the_tenants_with_open_reviews(desk: Desk) -> None:
    a = desk.in_review("one")
    b = desk.in_review("two")
    desk.in_review("three", tenant="globex")
    reviews = desk.ledger.reviews
    [count] = reviews.counts(tenant="acme")
    assert (count.action, count.n) == ("crm.close_case.v1", 2)
    reason = count.reason
    word = reason.split()[1]
    assert [r.op_id for r in reviews.list(tenant="acme", reason=word.upper())] == [a, b]
    assert reviews.list(tenant="acme", reason="no such reason at all") == ()
    assert reviews.list(tenant="acme", reason="%") == ()  # a wildcard is a character
    assert reviews.tenants_with_open_reviews() == (("acme", 2), ("globex", 1))


def test_search_history_and_payload_are_scoped_to_the_tenant(desk: Desk) -> None:
    op_id = desk.in_review("scoped")
    reviews = desk.ledger.reviews
    assert [o.id for o in reviews.search(tenant="acme", op_id=op_id)] == [op_id]
    assert [o.id for o in reviews.search(tenant="acme", target="case-scoped")] == [op_id]
    assert [o.id for o in reviews.search(tenant="acme", workflow_id="wf")] == [op_id]
    assert reviews.search(tenant="globex", op_id=op_id) == ()
    with pytest.raises(InvalidInput):
        reviews.search(tenant="acme")
    assert reviews.history(op_id, tenant="acme").operation.id == op_id
    assert reviews.payload(op_id, tenant="acme") == {"note": "resolved"}
    for read in (reviews.history, reviews.payload):
        with pytest.raises(OperationNotFound, match=f"no operation {op_id}$"):
            read(op_id, tenant="globex")


def test_a_stale_view_says_what_changed_in_python_and_in_the_cli(
    desk: Desk, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    op_id = desk.in_review("stale")
    reviews = desk.ledger.reviews
    reviews.show(op_id, tenant="acme", operator="alice")
    ev = desk.ledger.record_evidence(
        op_id, source="lookup", verdict="inconclusive", detail={"reason": "search lags"}
    )
    with pytest.raises(StaleView) as refused:
        reviews.resolve(op_id, tenant="acme", operator="alice", resolution="cancel", note="x")
    said = f"new evidence {ev.id} from lookup: inconclusive (search lags)"
    assert refused.value.fields["changes"] == (said + ", kept without moving the status",)
    assert said in str(refused.value)

    monkeypatch.setenv("OPLEDGER_DATABASE_URL", database_url)
    monkeypatch.setenv("OPLEDGER_CRM_URL", desk.sandbox.http_url)
    get_settings.cache_clear()  # read again with this environment, and again after
    try:
        result = CliRunner().invoke(
            cli,
            [
                "review",
                "resolve",
                op_id,
                "--tenant",
                "acme",
                "--operator",
                "alice",
                "--as",
                "cancel",
                "--note",
                "x",
            ],
        )
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 3
    assert f"what changed: {said}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
