"""Fixtures several integration test modules share."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.webhook import WebhookAdapter, webhook_contract
from opledger.cli.main import app
from opledger.dev.processes import unconfigured_environ
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Claim, Ledger
from opledger.settings import get_settings
from tests.clirun import Run
from tests.conftest import connect_ledger
from tests.desks import Desk


@pytest.fixture
def invoke(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Run]]:
    """`opledger ARGS` in this process (for the --json documents of successful commands)."""
    monkeypatch.setenv("OPLEDGER_DATABASE_URL", database_url)
    get_settings.cache_clear()

    def run(*args: str, **env: str) -> Run:
        get_settings.cache_clear()  # the settings are read again, with `env`
        result = CliRunner().invoke(app, list(args), env=env)
        return Run(result.exit_code, result.stdout, result.stderr)

    yield run
    get_settings.cache_clear()


@pytest.fixture
def env(database_url: str, tmp_path: Path) -> dict[str, str]:
    """What a console (or CLI) process of a test is started with: no OPLEDGER_ setting of
    this process's own, the session's database, a state directory of its own; no operator
    nor sign-in attempt left from another test."""
    with connect_ledger(database_url, autocommit=True) as conn:
        conn.execute("TRUNCATE operators, signin_attempts CASCADE")
    clean = unconfigured_environ()
    return clean | {"OPLEDGER_DATABASE_URL": database_url, "OPLEDGER_STATE_DIR": str(tmp_path)}


@pytest.fixture
def claim(ledger: Ledger) -> Claim:
    """A review notification as the ledger freezes it, claimed for sending."""
    ledger.grant(tenant="acme", scope=["webhook.*"], granted_by="t", ref="auth_hooks")
    op = ledger.prepare(
        tenant="acme",
        workflow_id="review:op_x",
        intent_key="review-opened:rev_1",
        action="webhook.post.v1",
        target="review-webhook",
        payload={
            "event": "review.opened",
            "review_id": "rev_1",
            "tenant": "acme",
            "reason": "unknown after 5 attempts: café ☕",  # non-ASCII bytes are signed too
        },
        authorization_ref="auth_hooks",
    )
    claimed = ledger.claim(op.id, owner="test")
    assert claimed is not None
    return claimed


@pytest.fixture
def adapters() -> Iterator[Callable[..., WebhookAdapter]]:
    """Real webhook adapters signing with the given secrets (and clock), closed after."""
    opened: list[WebhookAdapter] = []

    def make(url: str, *secrets: str, clock: Callable[[], float] = time.time) -> WebhookAdapter:
        adapter = WebhookAdapter(
            url,
            contract=webhook_contract(request_timeout=timedelta(seconds=5)),
            secrets=[SecretStr(s) for s in secrets],
            clock=clock,
        )
        opened.append(adapter)
        return adapter

    yield make
    for adapter in opened:
        adapter.close()


@pytest.fixture
def desk(ledger: Ledger, sandbox: Sandbox) -> Iterator[Desk]:
    """A reviewer's desk over a keyed CRM without lookups (`tests.desks.Desk`)."""
    made = Desk(ledger, sandbox)
    yield made
    made.close()


@pytest.fixture
def crms(sandbox: Sandbox) -> Iterator[Callable[..., CrmAdapter]]:
    """Real CRM adapters on the sandbox: `crms(**facts)` is one on `crm_contract(**facts)`,
    for account acme unless `account=` says otherwise; each is closed after the test."""
    opened: list[CrmAdapter] = []

    def make(*, account: str = "acme", **facts: Any) -> CrmAdapter:
        adapter = CrmAdapter(sandbox.http_url, account=account, contract=crm_contract(**facts))
        opened.append(adapter)
        return adapter

    yield make
    for adapter in opened:
        adapter.close()
