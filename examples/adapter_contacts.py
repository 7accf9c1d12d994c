"""An adapter for one's own API behind an idempotency middleware: Contacts, a small CRM (an
Express app) whose `POST /contacts` runs behind express-idempotency 1.0.6 with its defaults.

docs/adapters.md ("Your own API behind an idempotency middleware") explains it;
tests/system/test_idempotency_middleware.py runs it in real workers against a server of its
own that behaves as the middleware does.

What express-idempotency 1.0.6 does (its source: dist/services/idempotencyService.js and
dist/defaults/), and the contract below declares:

- Keys live in the process's memory (its default `InMemoryDataAdapter`) until the process
  ends: a restart or a deploy forgets every key. No key ever expires before that.
- A request with a new key is recorded before the route runs; its answer is stored only
  when the status is 2xx. Any other answer deletes the key: a 500 written after the route
  committed to the database leaves the contact created and the key free, so the same key
  again runs the route again.
- The same key again gets the stored status and body back, with nothing saying it is a
  replay. While the first request with the key still runs: 409. Another URL, method,
  query or body under a used key: 417.

What the Contacts app behind it does (our own code):

- A contact and the caller's reference (`ref`) are one row, written in one transaction.
- `GET /contacts?ref=...` reads that table: the contacts created with the reference, none
  when none committed.
- Its routes never answer 409 or 417 themselves, and every error, the middleware's
  included, is answered by its own error handler with `res.status(...).json(...)`.

Configure it with OPLEDGER_ADAPTERS=opledger.examples.adapter_contacts:build_registry (the
example as installed with opledger) and CONTACTS_URL in the environment of every opledger
process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import httpx

from opledger.adapters.base import (
    ABSENT,
    CONFIRMED,
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    INCONCLUSIVE,
    Contract,
    ErrorCodes,
    Idempotency,
    Lookup,
    LookupResult,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
)
from opledger.adapters.defaults import build_registry as bundled_registry
from opledger.adapters.registry import Registry
from opledger.ledger import (
    Ambiguous,
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Operation,
    Outcome,
    Rejected,
)
from opledger.ledger.canonical import canonicalize
from opledger.settings import Settings

CREATE = "contacts.create.v1"

#: the Contacts app's own error codes (the middleware's answers carry none)
CODES = ErrorCodes(definitive=frozenset({"invalid_contact"}))


def contacts_contract(request_timeout: timedelta = timedelta(seconds=10)) -> Contract:
    """What express-idempotency 1.0.6 and the Contacts app behind it do; the timeouts and
    the retention are our choices."""
    return Contract(
        provider="contacts",
        effect="contact",
        idempotency=Idempotency(
            kind="keyed",
            scope="the Contacts process",
            # kept until the process ends; opledger resends under a key only this long
            retention=timedelta(hours=24),
            # a non-2xx answer deletes the key, even after the route committed
            after_error="key_released",
            # in the process's memory: a restart forgets every key
            keys_durable=False,
            # another body under a used key: 417 (mapped to idempotency_mismatch below)
            payload_checked=True,
            # 409 at once while the first request with the key runs
            concurrent="conflict",
        ),
        # the contact names the reference we sent: our first key
        response_binds="key",
        # by our reference, from the table the contact is written to, "none" included
        lookup=Lookup(kind="status_api", interval=timedelta(seconds=5)),
        success_proves="applied",
        request_timeout=request_timeout,
        max_in_flight=request_timeout * 2,
        source="express-idempotency 1.0.6 defaults in front of the Contacts app: keys in "
        "process memory until a restart; a non-2xx answer deletes the key, even after the "
        "route committed; 409 while the first request runs, 417 for another body, replays "
        "unmarked; the contact and our ref in one transaction, GET /contacts?ref= from that "
        "table; the 24 h retention is ours",
    )


class ContactsAdapter:
    """Creates contacts in the Contacts app at `base_url`, one per target (an email)."""

    actions: tuple[str, ...] = (CREATE,)
    descriptions: ClassVar[Mapping[str, str]] = {
        CREATE: "Create a CRM contact; the target is their email address. Asked again, the "
        "first contact is returned.",
    }

    def __init__(self, base_url: str, *, contract: Contract | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.contract = scoped(contract or contacts_contract(), f"at {self.base_url}")
        # a released key protects no resend: a fresh connection for every request
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def dispatch(self, claim: Claim) -> Outcome:
        op = claim.operation
        if op.action not in self.actions:
            return Rejected(code="unsupported_action", reason=f"Contacts has no {op.action}")
        # our reference goes into the row: the marker is the same on every attempt, so the
        # bytes are too (the middleware compares bodies)
        body = {**claim.payload, "email": op.target, "ref": op.marker}
        try:
            response = self._client.post(
                f"{self.base_url}/contacts",
                content=canonicalize(body).text.encode(),
                headers={
                    "Idempotency-Key": claim.idempotency_key,
                    "Content-Type": "application/json",
                },
            )
            if response.status_code == 201:
                return _confirmed(response)
            return middleware_outcome(response)
        except Exception as exc:  # a timeout, a reset, a body we cannot read: never raised
            return outcome_for_http_error(exc)

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        try:
            response = self._client.get(
                f"{self.base_url}/contacts", params={"ref": operation.marker}
            )
            found = response.json().get("data") if response.status_code == 200 else None
        except Exception as exc:  # a failed read is no evidence
            reason = outcome_for_http_error(exc).reason
            return LookupResult(verdict=INCONCLUSIVE, detail={"error": reason})
        if not isinstance(found, list):
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        if not found:
            # authoritative: the contact and its ref commit together, and only we send it
            return LookupResult(verdict=ABSENT, binding=Binding(idempotency_key=operation.marker))
        return LookupResult(
            verdict=CONFIRMED,
            binding=_binding(found[0]),
            result=_result(found[0]),
            detail={"source": "contacts by ref", "found": len(found)},
        )

    def search_hint(self, operation: Operation) -> str:
        return f"a contact {operation.target} with ref {operation.marker} (GET /contacts?ref=)"

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, Any]]:
        """What `opledger contract check` sends: a contact kept for checks."""
        return self.actions[0], "contract-check@contacts.test", {"name": f"check {variant}"}

    def close(self) -> None:
        self._client.close()


def middleware_outcome(response: httpx.Response) -> Outcome:
    """A non-201 answer. express-idempotency answers with a status and no error code: 409
    while the first request with the key runs, 417 for another request under the key. The
    Contacts routes answer neither, so these two are the middleware's."""
    detail = {"status": response.status_code}
    if response.status_code == 409:
        return Ambiguous(code=IN_FLIGHT, reason="a request with this key runs", detail=detail)
    if response.status_code == 417:
        return Ambiguous(
            code=IDEMPOTENCY_MISMATCH, reason="key used with another request", detail=detail
        )
    return outcome_for_http_status(response, CODES, provider="Contacts", keyed=True)


def _confirmed(response: httpx.Response) -> Confirmed:
    contact = response.json()
    return Confirmed(
        receipt_id=str(contact["id"]),
        binding=_binding(contact),
        result=_result(contact),
        detail={"status": response.status_code},  # a replay looks the same: no marker
    )


def _binding(contact: dict[str, Any]) -> Binding:
    """A contact ties together our reference (the first key), itself and its email."""
    return Binding(
        idempotency_key=str(contact["ref"]),
        receipt_id=str(contact["id"]),
        target=str(contact["email"]),
    )


def _result(contact: dict[str, Any]) -> dict[str, Any]:
    return {k: contact[k] for k in ("id", "email", "name") if k in contact}


def build_registry(settings: Settings) -> Registry:
    """The `OPLEDGER_ADAPTERS` factory: the bundled adapters, and Contacts beside them."""
    url = os.environ.get("CONTACTS_URL")
    if not url:
        raise ValueError("CONTACTS_URL must be set")
    registry = bundled_registry(settings)
    timeout = timedelta(seconds=settings.provider_timeout_seconds)
    registry.register(ContactsAdapter(url, contract=contacts_contract(timeout)))
    return registry
