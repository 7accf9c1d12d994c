"""`opledger contract check` against the sandbox: silent when the contract is right, and
for each way a real provider differs, the fact it gets wrong."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from opledger.adapters.base import LookupResult
from opledger.adapters.check import UnsafeTarget, check_contract, endpoint_is_safe
from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.cli.main import app as cli
from opledger.dev.faultprobes import SandboxFaults
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Attempt, Binding, Operation
from opledger.ledger.models import Verdict
from opledger.settings import get_settings


@pytest.fixture
def crm(crms: Callable[..., CrmAdapter]) -> CrmAdapter:
    return crms(account="checked")


def _verdicts(sandbox: Sandbox, adapter: CrmAdapter) -> dict[str, str]:
    findings = check_contract(
        adapter, adapter.contract_probe, faults=SandboxFaults(sandbox.http_url, delay_s=0.5)
    )
    return {f.fact: f.verdict for f in findings}


def test_a_right_contract_shows_no_disagreement(sandbox: Sandbox, crm: CrmAdapter) -> None:
    verdicts = _verdicts(sandbox, crm)
    assert set(verdicts) == {
        "idempotency",
        "response_binds",
        "payload_checked",
        "concurrent",
        "max_key_length",
        "lookup",
        "lookup_binds",
        "lookup_absent",
        "after_error",
        "keys_durable",
    }
    assert set(verdicts.values()) == {"agrees"}, verdicts


@pytest.mark.parametrize(
    ("switch", "fact"),
    [
        ({"keys": False}, "idempotency"),
        ({"payload_check": False}, "payload_checked"),
        ({"inflight_conflict": False}, "concurrent"),
        ({"inflight_wait_s": 1.5}, "concurrent"),
        ({"replay_errors": False}, "after_error"),
        ({"keys_durable": False}, "keys_durable"),
        ({"echo_digest": False}, "response_binds"),
        ({"max_key_length": 100}, "max_key_length"),
        # a status API that does not answer (off): the lookup found nothing it can use
        ({"status_api": False}, "lookup"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else v,
)
def test_each_way_a_provider_differs_is_reported(
    sandbox: Sandbox, crm: CrmAdapter, switch: dict[str, Any], fact: str
) -> None:
    sandbox.configure(account="checked", **switch)
    verdicts = _verdicts(sandbox, crm)
    assert verdicts[fact] == "disagrees", verdicts


def test_a_contract_declaring_what_the_provider_does_agrees_again(
    sandbox: Sandbox, crms: Callable[..., CrmAdapter]
) -> None:
    sandbox.configure(
        account="honest", replay_errors=False, keys_durable=False, payload_check=False
    )
    adapter = crms(
        account="honest", after_error="key_released", keys_durable=False, payload_checked=False
    )
    verdicts = _verdicts(sandbox, adapter)
    assert set(verdicts.values()) == {"agrees"}, verdicts


def test_it_refuses_a_remote_endpoint_unless_told_so() -> None:
    remote = CrmAdapter("https://crm.example.com", account="prod")
    try:
        assert not endpoint_is_safe(remote)
        with pytest.raises(UnsafeTarget):
            check_contract(remote, remote.contract_probe)
        remote.test_base_url = "https://crm.example.com"  # type: ignore[attr-defined]
        assert endpoint_is_safe(remote)  # the adapter's declared test endpoint
    finally:
        remote.close()
    local = CrmAdapter("http://127.0.0.1:9", account="x")
    assert endpoint_is_safe(local)
    local.close()


def test_the_command_exits_non_zero_on_a_disagreement(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPLEDGER_CRM_URL", sandbox.http_url)
    monkeypatch.setenv("OPLEDGER_CRM_ACCOUNT", "cli-check")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        args = ["contract", "check", "crm.close_case.v1", "--admin-url", sandbox.http_url]
        ok = runner.invoke(cli, args)
        assert ok.exit_code == 0, ok.output
        assert "no disagreement" in ok.output
        sandbox.configure(account="cli-check", replay_errors=False)
        wrong = runner.invoke(cli, args)
        assert wrong.exit_code == 1, wrong.output
        assert "after_error" in wrong.output and "key_released" in wrong.output
    finally:
        get_settings.cache_clear()


def test_the_email_adapter_checks_clean_against_the_sandbox(sandbox: Sandbox) -> None:
    from opledger.adapters.email import EmailAdapter

    email = EmailAdapter(sandbox.http_url, account="mail-check")
    try:
        findings = check_contract(
            email, email.contract_probe, faults=SandboxFaults(sandbox.http_url, delay_s=0.5)
        )
    finally:
        email.close()
    verdicts = {f.fact: f.verdict for f in findings}
    assert "disagrees" not in verdicts.values(), findings
    assert verdicts["idempotency"] == verdicts["payload_checked"] == "agrees"


def test_the_lookup_is_probed_found_binding_and_absent(
    sandbox: Sandbox, crms: Callable[..., CrmAdapter]
) -> None:
    sandbox.configure(account="looked", search_lag_s=0.5)
    search = crms(account="looked", lookup="search", search_lag=timedelta(seconds=1))
    findings = {f.fact: f for f in check_contract(search, search.contract_probe)}
    # a lagging search finds the request once it caught up, bound by our key and body
    assert findings["lookup"].verdict == "agrees", findings
    assert findings["lookup_binds"].verdict == "agrees", findings
    assert "key" in findings["lookup_binds"].observed
    assert findings["lookup_absent"].verdict == "agrees"


def test_a_lookup_that_cannot_bind_our_body_disagrees(
    sandbox: Sandbox, crms: Callable[..., CrmAdapter]
) -> None:
    """A status API by key at a provider that neither checks nor names the body: what it
    finds may be someone else's request under our key, so it can never confirm ours."""
    sandbox.configure(account="unbound", payload_check=False, echo_digest=False)
    adapter = crms(account="unbound", payload_checked=False, response_binds="nothing")
    findings = {f.fact: f for f in check_contract(adapter, adapter.contract_probe)}
    assert findings["lookup"].verdict == "agrees"
    assert findings["lookup_binds"].verdict == "disagrees", findings
    assert "not enough to confirm" in findings["lookup_binds"].observed


@pytest.mark.parametrize("admin", ["no_routes", "closed_port"])
def test_an_admin_url_without_fault_routes_is_not_observable_and_no_traceback(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch, admin: str
) -> None:
    from opledger.dev.processes import free_port

    url = (
        f"{sandbox.http_url}/not-an-admin"
        if admin == "no_routes"
        else (f"http://127.0.0.1:{free_port()}")
    )
    monkeypatch.setenv("OPLEDGER_CRM_URL", sandbox.http_url)
    monkeypatch.setenv("OPLEDGER_CRM_ACCOUNT", f"no-admin-{admin}")
    get_settings.cache_clear()
    try:
        done = CliRunner().invoke(
            cli, ["contract", "check", "crm.update_case.v1", "--admin-url", url]
        )
    finally:
        get_settings.cache_clear()
    assert done.exception is None or isinstance(done.exception, SystemExit), done.output
    assert done.exit_code == 0, done.output
    assert "Traceback" not in done.output
    # what it could probe is printed, what it could not is said so
    for fact in ("idempotency", "payload_checked", "lookup_absent", "after_error"):
        assert fact in done.output, done.output
    assert "not observable" in done.output


class _RefusingLookup(CrmAdapter):
    """A real CRM adapter whose lookup answers "rejected" whatever it is asked."""

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        return LookupResult(
            verdict=Verdict.REJECTED, binding=Binding(idempotency_key=operation.idempotency_key)
        )


@pytest.mark.parametrize("kind", ["search", "status_api"])
def test_a_lookup_that_rejects_what_was_applied_disagrees(sandbox: Sandbox, kind: str) -> None:
    """The decision rejects on a binding "rejected": a lookup saying so of a request the
    provider applied would record our own payment as refused."""
    contract = crm_contract(lookup=kind, search_lag=timedelta(seconds=0.2))  # type: ignore[arg-type]
    adapter = _RefusingLookup(sandbox.http_url, account=f"refusing-{kind}", contract=contract)
    try:
        findings = {f.fact: f for f in check_contract(adapter, adapter.contract_probe)}
    finally:
        adapter.close()
    assert findings["lookup"].verdict == "disagrees", findings
    assert findings["lookup_absent"].verdict == "disagrees", findings
