"""The operator review queue against a real ledger, real sandbox providers and the CLI."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from opledger.cli.main import app as cli
from opledger.dev.sandbox import Sandbox
from opledger.ledger import (
    Ledger,
    Resolution,
    RetryNeedsNewKey,
    ReviewAlreadyResolved,
    ReviewNotFound,
    StaleView,
    Status,
)
from opledger.ledger.decide import Dispatch
from tests.desks import Desk


def test_a_review_opens_with_attempts_evidence_and_consequences(desk: Desk) -> None:
    op_id = desk.in_review()
    (summary,) = desk.ledger.reviews.list(tenant="acme")
    assert summary.op_id == op_id and "1 attempts" in summary.reason
    view = desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    key = desk.ledger.get(op_id).idempotency_key
    assert key.startswith("opk_")
    assert len(view.attempts) == 1 and view.attempts[0].idempotency_key == key
    assert [e.verdict for e in view.evidence] == ["ambiguous"]
    assert view.consequences is not None and view.consequences.same_key_retry_allowed
    snapshot = view.review.snapshot
    assert snapshot["consequences"]["retry"] and snapshot["contract"]["provider"] == "crm"
    assert snapshot["attempts"][0]["response"]["code"] == "connection_lost"


@pytest.mark.parametrize(
    ("how", "status"),
    [("confirmed", Status.CONFIRMED), ("rejected", Status.REJECTED), ("cancel", Status.CANCELLED)],
)
def test_settling_resolutions(desk: Desk, how: str, status: Status) -> None:
    op_id = desk.in_review()
    desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    after = desk.resolve(op_id, how, note=f"checked: {how}", evidence="saw it in the CRM UI")
    assert after.status is status
    history = desk.ledger.history(op_id)
    assert history.reviews[-1].resolution == how and history.reviews[-1].resolved_by == "alice"
    assert history.transitions[-1].actor == "alice"
    if how != "cancel":
        assert history.evidence[-1].source == "operator" and history.evidence[-1].applied
    (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
    assert (action.operator, action.resolution, action.note) == ("alice", how, f"checked: {how}")
    assert action.evidence == "saw it in the CRM UI" and action.fence == after.fence
    assert action.shown["consequences"]["cancel"]  # what they were shown, kept with it
    assert action.shown["record_version"] == after.record_version - 1


def test_retry_with_the_same_key_is_sent_once_and_marked_operator_authorized(desk: Desk) -> None:
    op_id = desk.in_review()
    desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    after = desk.resolve(op_id, "retry")
    assert after.status is Status.UNKNOWN and after.operator_retry_by == "alice"
    result = desk.reconcile(op_id)
    assert isinstance(result.decision, Dispatch)
    history = desk.ledger.history(op_id)
    assert history.operation.status is Status.CONFIRMED  # the provider replayed its response
    assert [a.authorized_by for a in history.attempts] == [None, "alice"]
    key = history.operation.idempotency_key
    assert [a.idempotency_key for a in history.attempts] == [key, key]
    assert desk.sandbox.effects(f"crm:{key}") == 1


def test_retry_past_the_key_retention_needs_a_new_key(ledger: Ledger, sandbox: Sandbox) -> None:
    desk = Desk(ledger, sandbox, retention=timedelta(seconds=2))
    try:
        sandbox.configure(retention_s=2.0)
        op_id = desk.in_review()
        time.sleep(2.0)  # the key's retention passes in real time, as the rules measure it
        desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
        with pytest.raises(RetryNeedsNewKey, match="keeps keys 2 s"):
            desk.resolve(op_id, "retry")
        before = desk.ledger.get(op_id)
        assert before.operator_retry_by is None
        key = before.idempotency_key
        assert key.startswith("opk_")
        after = desk.resolve(op_id, "retry", new_key=True)
        assert after.idempotency_key == f"{key}.k2"
        desk.reconcile(op_id)
        history = desk.ledger.history(op_id)
        assert [a.idempotency_key for a in history.attempts] == [key, f"{key}.k2"]
        assert history.attempts[-1].authorized_by == "alice"
        (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
        assert action.new_key == f"{key}.k2"
        # the case was already closed by the first (lost) attempt: the refusal of the retry
        # is most likely our own effect, not a rejection (rule 11)
        assert history.evidence[-1].detail["code"] == "state_conflict"
        assert history.operation.status is Status.UNKNOWN
        assert desk.sandbox.effects(f"crm:{key}") == 1
        assert desk.sandbox.effects(f"crm:{key}.k2") == 0  # the retry applied nothing
    finally:
        desk.close()


def test_resolving_twice_is_refused(desk: Desk) -> None:
    op_id = desk.in_review()
    desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    desk.resolve(op_id, "confirmed")
    with pytest.raises(ReviewAlreadyResolved, match="already resolved as confirmed by alice"):
        desk.resolve(op_id, "rejected")
    assert desk.ledger.get(op_id).status is Status.CONFIRMED


def test_a_stale_view_or_no_view_is_refused(desk: Desk) -> None:
    op_id = desk.in_review()
    with pytest.raises(StaleView, match="review show"):
        desk.resolve(op_id, "confirmed")  # never shown
    desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    desk.ledger.record_evidence(op_id, source="lookup", verdict="inconclusive")
    with pytest.raises(StaleView, match="changed since it was shown"):
        desk.resolve(op_id, "confirmed")
    assert desk.ledger.get(op_id).status is Status.UNKNOWN
    desk.ledger.reviews.show(op_id, tenant="acme", operator="alice")
    assert desk.resolve(op_id, "confirmed").status is Status.CONFIRMED


def test_another_tenant_cannot_list_see_or_resolve(desk: Desk) -> None:
    theirs = desk.in_review(tenant="globex", key="theirs")
    assert desk.ledger.reviews.list(tenant="acme") == ()
    with pytest.raises(ReviewNotFound):
        desk.ledger.reviews.show(theirs, tenant="acme", operator="alice")
    with pytest.raises(ReviewNotFound):
        desk.resolve(theirs, "cancel")
    assert desk.ledger.reviews.audit(theirs, tenant="acme") == ()
    assert desk.ledger.get(theirs).status is Status.UNKNOWN
    assert [r.op_id for r in desk.ledger.reviews.list(tenant="globex")] == [theirs]


def test_list_filters_by_age_and_action(desk: Desk) -> None:
    op_id = desk.in_review()
    assert desk.ledger.reviews.list(tenant="acme", older_than=timedelta(hours=1)) == ()
    with desk.ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE reviews SET opened_at = now() - interval '2 hours' WHERE op_id = :id"),
            {"id": op_id},
        )
    assert len(desk.ledger.reviews.list(tenant="acme", older_than=timedelta(hours=1))) == 1
    assert len(desk.ledger.reviews.list(tenant="acme", action="crm.*")) == 1
    assert desk.ledger.reviews.list(tenant="acme", action="email.*") == ()
    assert len(desk.ledger.reviews.list(tenant="acme", action="crm.close_case.v1")) == 1


def test_the_cli_lists_shows_and_resolves(
    desk: Desk, database_url: str, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opledger.settings import get_settings

    op_id = desk.in_review()
    monkeypatch.setenv("OPLEDGER_DATABASE_URL", database_url)
    monkeypatch.setenv("OPLEDGER_CRM_URL", sandbox.http_url)
    monkeypatch.setenv("COLUMNS", "250")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        listed = runner.invoke(cli, ["review", "list", "--tenant", "acme"])
        assert listed.exit_code == 0 and op_id in listed.output
        early = runner.invoke(
            cli,
            [
                "review",
                "resolve",
                op_id,
                "--tenant",
                "acme",
                "--operator",
                "bob",
                "--as",
                "confirmed",
                "--note",
                "looked",
            ],
        )
        assert early.exit_code == 3 and "review show" in early.output
        shown = runner.invoke(
            cli, ["review", "show", op_id, "--tenant", "acme", "--operator", "bob"]
        )
        assert shown.exit_code == 0, shown.output
        assert "consequences" in shown.output and "deduplicates by our key" in shown.output
        done = runner.invoke(
            cli,
            [
                "review",
                "resolve",
                op_id,
                "--tenant",
                "acme",
                "--operator",
                "bob",
                "--as",
                "cancel",
                "--note",
                "customer withdrew",
            ],
        )
        assert done.exit_code == 0, done.output
        assert "cancelled" in done.output
        again = runner.invoke(
            cli,
            [
                "review",
                "resolve",
                op_id,
                "--tenant",
                "acme",
                "--operator",
                "bob",
                "--as",
                "confirmed",
                "--note",
                "twice",
            ],
        )
        assert again.exit_code == 3 and "already resolved" in again.output
        other = runner.invoke(
            cli, ["review", "show", op_id, "--tenant", "globex", "--operator", "bob"]
        )
        assert other.exit_code == 3
        assert desk.ledger.get(op_id).status is Status.CANCELLED
        # one audit row: bob's cancel; the refused early and second resolutions wrote none
        (action,) = desk.ledger.reviews.audit(op_id, tenant="acme")
        assert (action.operator, action.resolution) == ("bob", Resolution.CANCEL)
        # the note as given, then who ran the command (the CLI's provenance)
        assert re.fullmatch(
            r"customer withdrew \[ran as os user \S+, db role \S+\]", action.note or ""
        ), action.note
    finally:
        get_settings.cache_clear()
