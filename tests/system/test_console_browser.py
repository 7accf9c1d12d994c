"""The review console in a real browser (Debian's Chromium, headless, via its chromedriver).

One stack of real processes makes the reviews: a worker armed to die with SIGKILL right
after the provider (a CRM without deduplication) applied each change, before anything was
saved; the sweeper fences the dead claims out, the reconciler finds nothing that can tell
what happened, and a review opens. Then a real `opledger console` process serves them to
one browser session for the whole module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from opledger.adapters.registry import load_registry
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from tests.conftest import truncate_all
from tests.consoles import browser_sign_in, chromium, opledger, running_console

from .conftest import crashes, settings_of, settled, worker_with

if TYPE_CHECKING:  # the browser tests import Selenium only once there is a browser
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.system

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "console-review.png"
PASSWORDS = {"alice": "alice-reviews-acme", "bob": "bob-reviews-globex"}


@dataclass
class Console:
    url: str
    ledger: Ledger
    ops: list[str]  #: acme's operations in review, made by real crashes


@pytest.fixture(scope="module")
def crashed(
    stack: Stack, session_ledger: Ledger, sandbox_server: Sandbox, database_url: str
) -> Iterator[tuple[Ledger, list[str]]]:
    """Three operations of tenant acme in review, each after a worker was SIGKILLed between
    the provider's answer and saving it."""
    truncate_all(database_url)
    sandbox_server.reset()
    configure_sandbox(sandbox_server, settings_of(stack.env))
    ledger = Ledger(session_ledger.engine, actions=load_registry(settings_of(stack.env)))
    for tenant in ("acme", "globex"):
        ledger.grant(tenant=tenant, scope=["*"], granted_by="test", ref=f"auth_{tenant}")
    if stack.beat is None or stack.beat.proc.poll() is not None:
        stack.start_beat()
    with worker_with(
        stack, "console-crashy", concurrency=1, OPLEDGER_CRASHPOINT="dispatch.after_call"
    ) as crashy:
        no_dedup = next(k for k in KINDS if k.name == "no-dedup")
        ops = [
            ledger.prepare(
                tenant="acme",
                workflow_id="onboarding-42",
                intent_key=f"close-{i}",
                # an update: its payload's fields may hold a secret (a close takes a note)
                action=f"{no_dedup.namespace}.update_case.v1",
                target=f"case-31{i}",
                payload={
                    "note": f"closed by the agent ({i})",
                    "fields": {"status": "closed", "token": "tok_secret"},
                },
                authorization_ref="auth_acme",
            ).id
            for i in range(3)
        ]
        from opledger.tasks.app import dispatch

        for op_id in ops:
            dispatch.delay(op_id)
        wait_until(lambda: crashes(crashy) >= len(ops), 60, "3 crashes")
    assert set(settled(ledger, ops, timeout=60).values()) == {Status.UNKNOWN}
    truth = sandbox_server.truth()["effects"]
    assert all(n == 1 for n in truth.values())  # each change applied once, then the crash
    yield ledger, ops


@pytest.fixture(scope="module")
def console(crashed: tuple[Ledger, list[str]], stack: Stack, workdir: Path) -> Iterator[Console]:
    ledger, ops = crashed
    env = dict(stack.env)
    assert opledger(env, "console", "--port", "1").returncode == 4  # no operator yet
    for name, tenant in (("alice", "acme"), ("bob", "globex")):
        added = opledger(
            env,
            "operator",
            "add",
            name,
            "--tenant",
            tenant,
            "--by",
            "test",
            "--password-stdin",
            stdin=PASSWORDS[name] + "\n",
        )
        assert added.returncode == 0, added.stderr
    with running_console(env, workdir / "console.log") as url:
        yield Console(url, ledger, ops)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def _sign_in(driver: WebDriver, console: Console, name: str) -> None:
    browser_sign_in(driver, console.url, name, PASSWORDS[name])


def _open_review(driver: WebDriver, console: Console, op_id: str) -> None:
    driver.get(f"{console.url}/t/acme/ops/{op_id}/review")


def _resolve(driver: WebDriver, resolution: str, note: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f"input[name=resolution][value={resolution}]").click()
    driver.find_element(By.ID, "note").send_keys(note)
    driver.find_element(By.ID, "resolve").click()


def test_sign_in_open_the_queue_and_a_crash_review_resolve_it_and_see_the_audit_row(
    browser: WebDriver, console: Console, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op_id = console.ops[0]
    _sign_in(d, console, "alice")
    rows = d.find_elements(By.CSS_SELECTOR, "tr.review-row")
    # oldest review first: the reviews open in whatever order the reconciles ran
    opened = {op: console.ledger.history(op).reviews[-1].opened_at for op in console.ops}
    assert [r.get_attribute("data-op") for r in rows] == sorted(console.ops, key=opened.__getitem__)
    assert "3 open" in d.find_element(By.ID, "total").text
    d.find_element(By.CSS_SELECTOR, f"tr[data-op='{op_id}'] a.op-link").click()

    assert d.find_element(By.ID, "op-id").text == op_id
    page = d.find_element(By.TAG_NAME, "main").text
    assert "no deduplication" in page  # the contract's facts in plain words
    assert "retrying sends a second" in page  # what a retry could cause
    attempts = d.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")
    assert len(attempts) == 1 and "not known" in attempts[0].text  # the killed attempt
    evidence = d.find_element(By.ID, "evidence").text
    assert "ambiguous" in evidence or "no evidence" in evidence
    payload = d.find_element(By.ID, "payload").text
    assert "closed by the agent (0)" in payload and "tok_secret" not in payload
    assert "fields.token" in d.find_element(By.ID, "hidden-fields").text
    # every run takes the screenshot; OPLEDGER_UPDATE_SCREENSHOT=1 puts it in docs/ (the
    # copy docs/console.md shows), so a plain run leaves the checkout unchanged
    shot = (
        SCREENSHOT if os.environ.get("OPLEDGER_UPDATE_SCREENSHOT") else tmp_path / SCREENSHOT.name
    )
    assert d.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # a second window on the same review: resolving from it afterwards must be refused
    first = d.current_window_handle
    d.switch_to.new_window("tab")
    _open_review(d, console, op_id)
    second = d.current_window_handle
    d.switch_to.window(first)
    # a forged operator field is ignored: the audit names the signed-in operator
    d.execute_script(
        "const f = document.getElementById('resolve-form');"
        "const i = document.createElement('input');"
        "i.type = 'hidden'; i.name = 'operator'; i.value = 'mallory'; f.appendChild(i);"
    )
    d.find_element(By.ID, "evidence-text").send_keys("CRM audit log: case-310 closed 10:02")
    _resolve(d, "confirmed", "the CRM shows the case closed by our call")
    assert "Resolved as confirmed" in d.find_element(By.ID, "resolved").text
    row = d.find_element(By.CSS_SELECTOR, "#audit tr.audit-row")
    assert row.find_element(By.CSS_SELECTOR, ".operator").text == "alice"
    assert row.find_element(By.CSS_SELECTOR, ".resolution").text == "confirmed"
    assert "closed by our call" in row.find_element(By.CSS_SELECTOR, ".note").text
    [action] = console.ledger.reviews.audit(op_id, tenant="acme")
    assert action.operator == "alice" and action.evidence is not None
    assert action.evidence.startswith("CRM audit log")
    assert console.ledger.get(op_id).status is Status.CONFIRMED

    d.switch_to.window(second)
    _resolve(d, "cancel", "resolving it twice")
    assert "already resolved as confirmed by alice" in d.find_element(By.ID, "refusal").text
    d.close()
    d.switch_to.window(first)
    assert len(console.ledger.reviews.audit(op_id, tenant="acme")) == 1


def test_a_stale_view_is_refused_with_what_changed(browser: WebDriver, console: Console) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op_id = console.ops[1]
    _sign_in(d, console, "alice")
    _open_review(d, console, op_id)
    seen = console.ledger.get(op_id).record_version
    ev = console.ledger.record_evidence(
        op_id, source="lookup", verdict="inconclusive", detail={"reason": "CRM search lags"}
    )
    _resolve(d, "cancel", "stop it")
    assert d.find_element(By.ID, "refusal").text == (
        "this operation changed since you opened it: here is what changed"
    )
    changes = d.find_element(By.ID, "changes").text
    assert f"new evidence {ev.id} from lookup: inconclusive (CRM search lags)" in changes
    assert console.ledger.get(op_id).status is Status.UNKNOWN
    assert console.ledger.get(op_id).record_version == seen + 1
    assert console.ledger.reviews.audit(op_id, tenant="acme") == ()
    d.find_element(By.ID, "open-again").click()  # looking again allows a decision
    _resolve(d, "cancel", "stop it, seen the new evidence")
    assert "Resolved as cancel" in d.find_element(By.ID, "resolved").text
    assert console.ledger.get(op_id).status is Status.CANCELLED


def test_a_form_without_the_csrf_token_is_refused(browser: WebDriver, console: Console) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op_id = console.ops[2]
    _sign_in(d, console, "alice")
    _open_review(d, console, op_id)
    d.execute_script("document.querySelector('#resolve-form input[name=csrf_token]').remove()")
    _resolve(d, "cancel", "no token")
    assert "CSRF" in d.find_element(By.ID, "refusal").text
    _open_review(d, console, op_id)
    d.execute_script(
        "document.querySelector('#resolve-form input[name=csrf_token]').value = 'forged'"
    )
    _resolve(d, "cancel", "a forged token")
    assert "CSRF" in d.find_element(By.ID, "refusal").text
    assert console.ledger.get(op_id).status is Status.UNKNOWN
    assert console.ledger.reviews.audit(op_id, tenant="acme") == ()


def test_another_tenants_operator_cannot_reach_the_review_by_url(
    browser: WebDriver, console: Console
) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    op_id = console.ops[2]
    _sign_in(d, console, "bob")
    assert op_id not in d.find_element(By.ID, "queue").text
    for path in (
        f"/t/acme/ops/{op_id}/review",
        f"/t/globex/ops/{op_id}/review",
        f"/t/acme/ops/{op_id}",
        f"/t/acme/ops/{op_id}/audit",
    ):
        d.get(console.url + path)
        assert d.find_element(By.ID, "refusal-title").text == "not found", path
        assert op_id not in d.find_element(By.TAG_NAME, "main").text
    d.get(f"{console.url}/search?by=id&q={op_id}")
    assert "nothing found" in d.find_element(By.ID, "results").text
    with console.ledger.engine.connect() as conn:
        from sqlalchemy import text

        views = conn.execute(
            text("SELECT count(*) FROM review_views WHERE operator = 'bob'")
        ).scalar_one()
    assert views == 0
