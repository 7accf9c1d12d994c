"""opledger in real Celery workers against an API behind an idempotency middleware that does
what express-idempotency 1.0.6 does (tests/idem_middleware.py: keys in memory, released by
any non-2xx answer, forgotten by a restart; the CRM's contacts survive both).

With the contract docs/adapters.md gives for it (examples/adapter_contacts.py: keys released
on an error and not durable, a lookup by our own reference), a 500 after the commit and a
restart between the attempt and the retry each leave one contact. With the Tickets guide's
contract copied for it (durable keys, nothing applied on an error, no lookup), each leaves
two, and the ledger calls them confirmed: the hazard the honest contract removes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from examples.adapter_contacts import CREATE
from opledger.adapters.registry import load_registry
from opledger.dev.processes import Stack
from opledger.ledger import Ledger, Operation, Status
from opledger.ledger.models import EvidenceSource, Verdict
from opledger.tasks.app import dispatch
from tests.conftest import truncate_all
from tests.idem_middleware import NAIVE, ContactsServer, contacts_server

from .conftest import settings_of, settled, worker_with

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def crm() -> Iterator[ContactsServer]:
    with contacts_server() as server:
        yield server


@contextmanager
def contacts_worker(
    running: Stack,
    ledger: Ledger,
    database_url: str,
    crm: ContactsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Ledger]:
    """The shared worker replaced by one whose registry has both Contacts adapters."""
    env = {
        "OPLEDGER_ADAPTERS": "tests.idem_middleware:build_registry",
        "CONTACTS_URL": crm.url,
        "PYTHONPATH": str(REPO),
    }
    monkeypatch.setenv("CONTACTS_URL", crm.url)  # the factory reads it here too
    registry = load_registry(settings_of({**running.env, **env}))
    led = Ledger(ledger.engine, actions=registry)
    led.grant(tenant="acme", scope=["contacts*"], granted_by="test", ref="auth_contacts")
    try:
        with worker_with(running, "w1", 2, **env):
            try:
                yield led
            finally:
                # the plain worker put back serves no Contacts action: an open operation
                # of one would stop it from starting (its startup check)
                truncate_all(database_url)
    finally:
        registry.close()


FAULTS = ("error_after_commit", "crash_after_commit")


def ask(ledger: Ledger, crm: ContactsServer, action: str, fault: str) -> Operation:
    """A contact asked for under `action`, `fault` armed for its key, and handed to the
    workers."""
    email = f"ada-{uuid.uuid4().hex[:8]}@example.test"
    op = ledger.prepare(
        tenant="acme",
        workflow_id="crm-sync",
        intent_key=f"contact-{email}",
        action=action,
        target=email,
        payload={"name": "Ada Lovelace"},
        authorization_ref="auth_contacts",
    )
    crm.arm(fault, key=op.idempotency_key)
    dispatch.delay(op.id)
    return op


def test_a_500_after_commit_and_a_restart_duplicate_only_under_an_over_promising_contract(
    running: Stack,
    ledger: Ledger,
    database_url: str,
    crm: ContactsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each fault once under the docs' contract (`contacts.create.v1`) and once under the
    Tickets guide's facts copied for the middleware (`contacts_naive.create.v1`), all at
    once in one worker."""
    restarts = crm.restarts
    with contacts_worker(running, ledger, database_url, crm, monkeypatch) as led:
        ops = {
            (action, fault): ask(led, crm, action, fault)
            for action in (CREATE, NAIVE)
            for fault in FAULTS
        }
        settled(led, [op.id for op in ops.values()], timeout=20)
        histories = {case: led.history(op.id) for case, op in ops.items()}
    assert crm.restarts == restarts + 2  # each crash restarted it, forgetting every key
    for fault in FAULTS:
        history, op = histories[CREATE, fault], ops[CREATE, fault]
        contacts = crm.with_ref(op.marker)
        # the docs' contract: 0 duplicates; the lookup by our own reference found the
        # contact the failed or lost attempt had committed (on a loaded machine our own
        # timeout may cut the first attempt while the middleware still holds its key: a
        # resend then meets its 409, never the route)
        assert len(contacts) == 1, (fault, contacts)
        assert history.operation.status is Status.CONFIRMED, (fault, history.reviews)
        found = [e.verdict for e in history.evidence if e.source == EvidenceSource.LOOKUP]
        assert Verdict.CONFIRMED in found, (fault, found)
        assert history.operation.provider_result_id == contacts[0]["id"]
    for fault in FAULTS:
        # the hazard: durable keys and nothing applied on an error, declared for a
        # middleware that releases a key on a 500 and forgets keys on a restart. The
        # same-key resend ran the route again, and the ledger calls it a confirmation
        history, op = histories[NAIVE, fault], ops[NAIVE, fault]
        assert len(crm.with_ref(op.marker)) == 2, fault
        assert history.operation.status is Status.CONFIRMED, fault
        # (two attempts at least: on a loaded machine a resend may also time out, and the
        # next resend under the same key is answered from the middleware's store)
        assert len(history.attempts) >= 2 and not history.reviews, (fault, history.attempts)
