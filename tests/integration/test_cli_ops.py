"""`opledger ops` and `opledger review resolve` against the test Postgres: what each piece
of evidence proves in words, `ops cancel`, `ops list`'s filters and pages, who ran a
resolution or a cancel (the OS user and the database role beside the operator's name),
and failures as one line starting `opledger: `, usage errors included.

The refusals' exit codes and the resolution while the broker is down are real processes'
(forked from a server that imported the command once: `tests.consoles.cli_forked`); the
rest goes through Typer's test runner.
"""

from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from opledger.ledger import (
    Ambiguous,
    Binding,
    EvidenceSource,
    InvalidInput,
    Ledger,
    Rejected,
    Status,
    Verdict,
)
from tests.clirun import (
    BROKER_DOWN,
    Run,
    in_review,
    one_line_failure,
)
from tests.consoles import cli_forked


def _prepare(ledger: Ledger, key: str, *, workflow: str = "wf-ops", action: str = "") -> str:
    return ledger.prepare(
        tenant="acme",
        workflow_id=workflow,
        intent_key=key,
        action=action or "crm.close_case.v1",
        target=f"case-{key}",
        payload={"note": key},
        authorization_ref="auth_acme",
    ).id


def _db_role(ledger: Ledger) -> str:
    with ledger.engine.connect() as conn:
        return str(conn.execute(text("SELECT current_user")).scalar_one())


def _field_values(out: str, name: str) -> list[str]:
    """The values of field `name` in tables printed piped at 80 columns, one record after
    the other (psql's expanded mode: a "name  value" line per field)."""
    return [line[len(name) :].strip() for line in out.splitlines() if line.startswith(name + " ")]


def test_ops_show_says_what_each_piece_of_evidence_proves(
    ledger: Ledger, grant: str, invoke: Callable[..., Run]
) -> None:
    # an ambiguous outcome moved the status to unknown: it proves nothing either way
    op_id = in_review(ledger, "proofs", {"note": "x"})
    op = ledger.get(op_id)
    key, digest = op.idempotency_key, op.payload_digest
    lookup = EvidenceSource.LOOKUP
    ledger.record_evidence(
        op_id, source=lookup, verdict=Verdict.ABSENT, binding=Binding(idempotency_key=key)
    )  # "never seen" while the attempt may still be in flight: proves nothing yet
    ledger.record_evidence(
        op_id,
        source=lookup,
        verdict=Verdict.CONFIRMED,
        binding=Binding(idempotency_key="someone-else", payload_digest=digest),
    )  # a receipt for another request: not ours
    ledger.record_evidence(
        op_id,
        source=lookup,
        verdict=Verdict.CONFIRMED,
        binding=Binding(idempotency_key=key, payload_digest=digest),
    )
    # a definitive refusal of a second operation's only attempt
    refused = _prepare(ledger, "refused")
    claim = ledger.claim(refused, owner="w1")
    assert claim is not None
    ledger.record_outcome(claim, Rejected(code="case_locked", reason="the case is locked"))
    # a third whose attempt provably sent nothing
    unsent = _prepare(ledger, "unsent")
    claim = ledger.claim(unsent, owner="w1")
    assert claim is not None
    ledger.record_outcome(claim, Ambiguous(code="not_sent", reason="connection refused"))

    shown = invoke("ops", "show", op_id)
    document = invoke("ops", "show", op_id, "--json").json()
    rejected = invoke("ops", "show", refused, "--json").json()
    not_sent = invoke("ops", "show", unsent, "--json").json()

    assert shown.code == 0, shown.err
    expected = ["unknown", "unknown", "unknown", "applied"]
    assert _field_values(shown.out, "proves") == expected, shown.out
    # "applied" no longer names whether the evidence moved the status: that is said apart
    moved = _field_values(shown.out, "moved status")
    assert moved == ["yes", "no (kept)", "no (kept)", "no (kept)"], shown.out
    assert not any(line.startswith("applied ") for line in shown.out.splitlines()), shown.out
    assert [(e["verdict"], e["proves"]) for e in document["evidence"]] == [
        ("ambiguous", "unknown"),
        ("absent", "unknown"),
        ("confirmed", "unknown"),
        ("confirmed", "applied"),
    ]
    assert "applied" in document["evidence"][0]  # the record's own fields are all still there
    assert [(e["verdict"], e["proves"], e["applied"]) for e in rejected["evidence"]] == [
        ("rejected", "not applied", True)
    ]
    assert [e["proves"] for e in not_sent["evidence"]] == ["not applied"]

    # once every attempt is past its in-flight deadline, "never seen" proves it never applied
    with ledger.engine.begin() as conn:
        conn.execute(
            text("UPDATE attempts SET deadline_at = now() - interval '1 hour' WHERE op_id = :id"),
            {"id": op_id},
        )
    later = invoke("ops", "show", op_id, "--json").json()
    assert [e["proves"] for e in later["evidence"]][1] == "not applied"


def test_ops_cancel_records_who_and_refuses_in_one_line(
    ledger: Ledger, grant: str, database_url: str, invoke: Callable[..., Run]
) -> None:
    prepared = _prepare(ledger, "cancel-me")
    attempted = in_review(ledger, "attempted", {"note": "x"})
    before = ledger.get(attempted)
    missing = "op_01J0000000000000000000000Z"
    db = database_url

    malformed, unknown, refused = cli_forked(
        (db, "ops", "cancel", "op_nope", "--reason", "r"),
        (db, "ops", "cancel", missing, "--reason", "r"),
        (db, "ops", "cancel", attempted, "--reason", "r", "--operator", "alice"),
    )
    one_line_failure(malformed, 3, "opledger: refused: not an operation id", "op_nope")
    one_line_failure(unknown, 3, "opledger: refused: no operation", missing)
    one_line_failure(refused, 3, "opledger: refused:", "nothing of which reached", "review")
    assert ledger.get(attempted) == before  # refused: nothing changed

    done = invoke(
        "ops", "cancel", prepared, "--reason", "wrong customer", "--operator", "alice", "--json"
    )
    assert done.code == 0, done.err
    assert done.json()["status"] == "cancelled"
    assert ledger.get(prepared).status is Status.CANCELLED
    actor = f"alice (os user {getpass.getuser()}, db role {_db_role(ledger)})"
    last = ledger.history(prepared).transitions[-1]
    assert (last.to_status, last.actor, last.reason) == (
        Status.CANCELLED,
        actor,
        "wrong customer",
    )
    shown = invoke("ops", "show", prepared)
    assert "alice (os user" in shown.out and "wrong customer" in shown.out, shown.out

    again = invoke("ops", "cancel", prepared, "--reason", "twice")
    one_line_failure(again, 3, "opledger: refused:", "is cancelled")


def test_ops_list_filters_and_pages(ledger: Ledger, grant: str, invoke: Callable[..., Run]) -> None:
    ids = [
        _prepare(ledger, f"k{i}", workflow=f"wf-{i % 2}", action=action)
        for i, action in enumerate(
            ["crm.close_case.v1", "email.send.v1", "crm.close_case.v1", "crm.add_note.v1"] * 2
        )
    ]
    newest_first = ids[::-1]

    def listed(*args: str) -> list[str]:
        run = invoke("ops", "list", *args, "--json")
        assert run.code == 0, run.err
        return [op["id"] for op in run.json()]

    assert listed("--workflow", "wf-1") == [i for i in newest_first if ids.index(i) % 2 == 1]
    assert listed("--action", "email.send.v1") == [newest_first[2], newest_first[6]]
    assert listed("--action", "crm.*", "--workflow", "wf-0") == [
        i for i in newest_first if ids.index(i) % 2 == 0
    ]
    assert listed("--action", "crm.close*") == [
        i for i in newest_first if ids.index(i) % 4 in (0, 2)
    ]

    # pages of 3: each full page says how to get the next; together they are all, once
    pages: list[list[str]] = []
    cursor: list[str] = []
    while True:
        table = invoke("ops", "list", "--limit", "3", *cursor)
        page = listed("--limit", "3", *cursor)
        pages.append(page)
        if len(page) < 3 or page[-1] == ids[0]:
            assert "--before" not in table.out
            break
        assert f"more: add --before {page[-1]} for the next page" in table.out, table.out
        cursor = ["--before", page[-1]]
    assert [i for page in pages for i in page] == newest_first
    assert [len(p) for p in pages] == [3, 3, 2]
    assert ledger.list(before=ids[1], limit=10) == (ledger.get(ids[0]),)

    bad_cursor = invoke("ops", "list", "--before", "op_x")
    bad_action = invoke("ops", "list", "--action", "Close Case")
    one_line_failure(bad_cursor, 3, "opledger: refused: not an operation id")
    one_line_failure(bad_action, 3, "opledger: refused: not a versioned action name")
    with pytest.raises(InvalidInput):
        ledger.list(before="1")
    with pytest.raises(InvalidInput):
        ledger.list(workflow_id="")
    with pytest.raises(InvalidInput):
        ledger.list(action="crm")


def test_a_resolution_records_the_os_user_and_db_role_beside_the_operator(
    ledger: Ledger, grant: str, database_url: str, invoke: Callable[..., Run]
) -> None:
    op_id = in_review(ledger, "who", {"note": "x"})
    ledger.reviews.show(op_id, tenant="acme", operator="bob")
    ran_as = f"[ran as os user {getpass.getuser()}, db role {_db_role(ledger)}]"

    [resolved] = cli_forked(
        (database_url, "review", "resolve", op_id, "--tenant", "acme", "--operator", "bob",
         "--as", "retry", "--new-key", "--note", "asked again"),
        OPLEDGER_BROKER_URL=BROKER_DOWN,
    )  # fmt: skip
    assert resolved.code == 0, resolved.err

    (action,) = invoke("review", "audit", op_id, "--tenant", "acme", "--json").json()
    assert action["operator"] == "bob"  # the name the view was recorded under, unchanged
    assert action["note"] == f"asked again {ran_as}"
    (review,) = ledger.history(op_id).reviews
    assert (review.resolved_by, review.note) == ("bob", f"asked again {ran_as}")
    shown = invoke("ops", "show", op_id)
    assert "reviews" in shown.out and ran_as in " ".join(shown.out.split()), shown.out

    # a new review of the same operation shows the earlier resolution, and who ran it
    assert ledger.open_review(op_id, fence=ledger.get(op_id).fence, reason="lost again")
    again = invoke("review", "show", op_id, "--tenant", "acme", "--operator", "carol")
    assert again.code == 0, again.err
    assert "earlier resolutions" in again.out
    assert ran_as in " ".join(again.out.split()), again.out


def test_usage_errors_are_one_line_like_every_other_failure(
    ledger: Ledger, invoke: Callable[..., Run]
) -> None:
    naive = ("--tenant", "acme", "--scope", "crm.*", "--by", "bob", "--expires-at", "2040-01-31")
    runs: dict[str, Any] = {
        "unknown option": invoke("ops", "list", "--bogus"),
        "bad age": invoke("review", "list", "--tenant", "acme", "--older-than", "soon"),
        "missing option": invoke("ops", "cancel", "op_01J0000000000000000000000Z"),
        "no timezone": invoke("grant", "create", *naive),
    }
    for what, run in runs.items():
        assert run.code == 2, (what, run.code, run.err)
        assert len(run.err_lines) == 1 and run.err.startswith("opledger: usage: "), (what, run.err)
        assert "--help" in run.err and not run.out, (what, run.err)
    assert "--bogus" in runs["unknown option"].err
    assert "age 'soon'" in runs["bad age"].err
    assert "--reason" in runs["missing option"].err
    assert "timezone" in runs["no timezone"].err
