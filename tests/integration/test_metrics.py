"""The ledger's gauges, read at scrape time from the partial indexes, and the metrics
endpoint's auth (the same rules as Flower's)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from opledger.cli.main import app as cli
from opledger.ledger import Ledger
from opledger.ledger.queries.gauges import BY_STATUS_AND_ACTION
from opledger.observability.server import make_server
from opledger.settings import get_settings
from tests.conftest import SCHEMA
from tests.intents import prepare
from tests.prom import samples

AUTH = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}


@pytest.fixture
def endpoint(ledger: Ledger) -> Iterator[str]:
    server = make_server(ledger.engine, user="prom", password="s3cret", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def test_gauges_count_open_operations_by_status_and_action_and_reviews(
    ledger: Ledger, grant: str, endpoint: str
) -> None:
    prepare(ledger, "a")
    prepare(ledger, "b")
    prepare(ledger, "c", action="email.send.v1")
    stuck = prepare(ledger, "d")
    assert ledger.claim(stuck, owner="t", lease=timedelta(milliseconds=1)) is not None
    time.sleep(0.05)
    assert ledger.expire_leases() == [stuck]
    unknown = ledger.get(stuck)
    got = samples(httpx.get(f"{endpoint}/metrics", headers=AUTH).text)
    ops = "opledger_operations"
    assert got[(ops, (("action", "crm.close_case.v1"), ("status", "prepared")))] == 2
    assert got[(ops, (("action", "email.send.v1"), ("status", "prepared")))] == 1
    assert got[(ops, (("action", "crm.close_case.v1"), ("status", "unknown")))] == 1
    assert got[(ops, (("action", ""), ("status", "dispatching")))] == 0
    assert got[("opledger_oldest_prepared_age_seconds", ())] > 0
    assert got[("opledger_oldest_unknown_age_seconds", ())] > 0
    assert got[("opledger_reviews_open", ())] == 0
    assert got[("opledger_ledger_up", ())] == 1
    ledger.open_review(stuck, fence=unknown.fence, reason="nothing can tell")
    got = samples(httpx.get(f"{endpoint}/metrics", headers=AUTH).text)
    assert got[("opledger_reviews_open", ())] == 1
    assert got[("opledger_oldest_open_review_age_seconds", ())] >= 0


def test_the_approval_gauges_count_what_waits_for_a_person(ledger: Ledger, endpoint: str) -> None:
    from opledger.adapters.registry import Registry
    from opledger.adapters.stripe import StripeAdapter
    from opledger.ledger.intents import Intent

    got = samples(httpx.get(f"{endpoint}/metrics", headers=AUTH).text)
    assert got[("opledger_approvals_pending", ())] == 0
    assert got[("opledger_oldest_pending_approval_age_seconds", ())] == 0
    registry = Registry([StripeAdapter("http://127.0.0.1:9", api_key="sk_test_123")])
    registry.require_approval("stripe.refund.v1", "always")
    held = Ledger(ledger.engine, actions=registry)
    held.grant(tenant="acme", scope=["stripe.*"], granted_by="test", ref="auth_s")
    for charge in ("ch_1", "ch_2"):
        intent = Intent(
            tenant="acme",
            workflow_id="run-1",
            action="stripe.refund.v1",
            target=charge,
            payload={"amount": 500},
            authorization_ref="auth_s",
        )
        held.ask_intent(intent)
    time.sleep(0.01)  # the oldest request's age is above 0
    got = samples(httpx.get(f"{endpoint}/metrics", headers=AUTH).text)
    assert got[("opledger_approvals_pending", ())] == 2
    assert got[("opledger_oldest_pending_approval_age_seconds", ())] > 0


def test_the_status_query_can_be_served_by_the_sweeps_partial_indexes(ledger: Ledger) -> None:
    with ledger.engine.connect() as conn:
        conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = "\n".join(conn.execute(text(f"EXPLAIN {BY_STATUS_AND_ACTION}")).scalars())
    for index in ("ix_operations_prepared", "ix_operations_stale_lease", "ix_operations_due_check"):
        assert index in plan, plan


def test_the_beat_lock_gauge_follows_the_beats_advisory_lock(
    ledger: Ledger, database_url: str, endpoint: str
) -> None:
    from opledger.tasks.beat import BeatLock, BeatLockTaken

    def held() -> float:
        return samples(httpx.get(f"{endpoint}/metrics", headers=AUTH).text)[
            ("opledger_beat_lock_held", ())
        ]

    assert held() == 0
    # the beat of a ledger in another schema of the same database is another beat: it
    # neither counts here nor keeps this ledger's beat from starting
    other = BeatLock(database_url, schema="billing_ledger")
    try:
        assert held() == 0
        lock = BeatLock(database_url, schema=SCHEMA)
        try:
            assert held() == 1
            with pytest.raises(BeatLockTaken):  # and a second one of this ledger's is refused
                BeatLock(database_url, schema=SCHEMA)
        finally:
            lock.release()
    finally:
        other.release()


def test_the_endpoint_asks_for_the_password_like_flower(endpoint: str) -> None:
    missing = httpx.get(f"{endpoint}/metrics")
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Basic ")
    wrong = base64.b64encode(b"prom:nope").decode()
    assert (
        httpx.get(f"{endpoint}/metrics", headers={"Authorization": f"Basic {wrong}"}).status_code
        == 401
    )
    assert httpx.get(f"{endpoint}/other", headers=AUTH).status_code == 404
    assert httpx.get(f"{endpoint}/metrics", headers=AUTH).status_code == 200


def test_the_command_never_runs_without_a_password(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPLEDGER_DATABASE_URL", database_url)
    monkeypatch.delenv("OPLEDGER_FLOWER_PASSWORD", raising=False)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(cli, ["metrics", "--port", "0"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 4  # a missing setting (docs/cli.md: exit 4), not usage
    assert "OPLEDGER_FLOWER_PASSWORD" in result.stderr
