"""`opledger contract check` against an API behind a middleware that does what
express-idempotency 1.0.6 does (tests/idem_middleware.py, which has the sandbox's fault
routes): the docs' contract for it agrees fact by fact; the Tickets guide's facts copied for
it over-promise on `after_error` and `keys_durable`, and the check says which field to set,
to what, and that a lookup is missing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from examples.adapter_contacts import ContactsAdapter
from opledger.adapters.check import Finding, check_contract
from opledger.adapters.presets import EXPRESS_IDEMPOTENCY
from opledger.cli.main import app as cli
from opledger.dev.faultprobes import SandboxFaults
from opledger.settings import get_settings
from tests.idem_middleware import NAIVE, ContactsServer, NaiveContacts, contacts_server
from tests.idem_middleware import over_promising as over_promising_contract


@pytest.fixture(scope="module")
def crm() -> Iterator[ContactsServer]:
    with contacts_server() as server:
        yield server


def _check(adapter: ContactsAdapter, crm: ContactsServer) -> dict[str, Finding]:
    try:
        findings = check_contract(
            adapter, adapter.contract_probe, faults=SandboxFaults(crm.url, delay_s=0.3)
        )
    finally:
        adapter.close()
    return {f.fact: f for f in findings}


def test_the_docs_contract_agrees_with_the_middleware(crm: ContactsServer) -> None:
    findings = _check(ContactsAdapter(crm.url), crm)
    assert {f.verdict for f in findings.values()} == {"agrees"}, findings
    assert findings["after_error"].observed == "key_released"
    assert findings["keys_durable"].observed == "the key was forgotten"
    assert findings["concurrent"].observed.startswith("the second was refused")  # its 409
    assert findings["payload_checked"].observed == "refused as another payload"  # its 417
    assert not any(f.hint for f in findings.values())


def test_the_docs_contract_declares_the_presets_facts() -> None:
    """The worked example starts from what the preset says of the middleware, and adds
    the lookup its own API offers."""
    adapter = ContactsAdapter("http://127.0.0.1:9")
    adapter.close()
    ours, preset = adapter.contract.idempotency, EXPRESS_IDEMPOTENCY.idempotency
    assert ours.model_dump(exclude={"scope"}) == preset.model_dump(exclude={"scope"})
    assert EXPRESS_IDEMPOTENCY.lookup.kind == "none"
    assert adapter.contract.lookup.kind == "status_api"


def test_an_over_promising_contract_gets_a_hint_per_fact(crm: ContactsServer) -> None:
    findings = _check(NaiveContacts(crm.url, contract=over_promising_contract()), crm)
    wrong = {fact for fact, f in findings.items() if f.verdict == "disagrees"}
    assert wrong == {"after_error", "keys_durable"}, findings
    after_error, durable = findings["after_error"], findings["keys_durable"]
    assert after_error.over_promises and durable.over_promises
    assert after_error.hint.startswith('idempotency.after_error="key_released": a 500 after')
    assert durable.hint.startswith("idempotency.keys_durable=False: a restart forgot the key")
    # the contract has no lookup: the hint says what makes a 500 after the commit safe
    assert 'lookup.kind="status_api"' in after_error.hint


def test_the_command_prints_the_hints_and_exits_1(
    crm: ContactsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPLEDGER_ADAPTERS", "tests.idem_middleware:build_registry")
    monkeypatch.setenv("CONTACTS_URL", crm.url)
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    try:
        args = ["contract", "check", NAIVE, "--admin-url", crm.url, "--concurrency-delay", "0.3"]
        done = CliRunner().invoke(cli, args)
    finally:
        get_settings.cache_clear()
    assert done.exit_code == 1, done.output
    lines = [" ".join(line.split()) for line in done.output.splitlines()]
    assert any(
        line.startswith('over-promises: set idempotency.after_error="key_released"')
        for line in lines
    ), done.output
    assert any(
        line.startswith("over-promises: set idempotency.keys_durable=False") for line in lines
    ), done.output
