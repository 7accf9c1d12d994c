"""An adapter for Tickets, a fictional help-desk API: open a ticket for a customer, once.

docs/adapters.md explains it line by line (the guide shows this file whole);
tests/integration/test_adapter_guide.py runs it against a Tickets server of its own.

What the Tickets documentation promises, and the contract below declares:

- `POST /v1/customers/{customer}/tickets` opens a ticket. Its `Idempotency-Key` header
  (at most 255 characters) is kept for 24 hours, in the same database transaction as the
  ticket: a failed request leaves nothing applied and the key unused.
- The same key and body again: the first answer, with `Idempotent-Replayed: true`. The
  same key with another body: 422 `idempotency_key_reused`. While the first request with
  the key is still running: 409 `request_in_progress`.
- A 201 answer is the ticket, naming the key it was opened under.
- `GET /v1/requests/{key}` answers from that database: 200 with the request's `state`
  (`processing`; `succeeded` with the ticket; `failed` with the error), or 404
  `no_such_request` for a key it never saw.

Configure it with OPLEDGER_ADAPTERS=opledger.examples.adapter_tickets:build_registry (the
example as installed with opledger) and TICKETS_URL, TICKETS_TOKEN (and TICKETS_ACCOUNT) in
the environment of every opledger process.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar
from urllib.parse import quote

import httpx

from opledger.adapters.base import (
    ABSENT,
    CONFIRMED,
    INCONCLUSIVE,
    PENDING,
    REJECTED,
    Contract,
    ErrorCodes,
    Idempotency,
    Lookup,
    LookupResult,
    error_code,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
)
from opledger.adapters.defaults import build_registry as bundled_registry
from opledger.adapters.registry import Registry
from opledger.ledger import Attempt, Binding, Claim, Confirmed, Operation, Outcome, Rejected
from opledger.settings import Settings

OPEN = "tickets.open.v1"

#: the provider's error codes, by what each means for the retry decision
CODES = ErrorCodes(
    definitive=frozenset({"invalid_ticket", "unknown_customer"}),  # refused, nothing applied
    in_flight=frozenset({"request_in_progress"}),  # the first request with the key still runs
    mismatch=frozenset({"idempotency_key_reused"}),  # our key, used with another body
)

TICKET_SCHEMA = {
    "type": "object",
    "properties": {
        "queue": {"type": "string", "enum": ["billing", "technical", "general"]},
        "subject": {"type": "string", "maxLength": 200},
        "body": {"type": "string", "maxLength": 10000},
    },
    "required": ["queue", "subject"],
    "additionalProperties": False,
}


def tickets_contract(request_timeout: timedelta = timedelta(seconds=10)) -> Contract:
    """What the Tickets documentation promises; the timeouts are our client's choice."""
    return Contract(
        provider="tickets",
        effect="ticket",
        idempotency=Idempotency(
            kind="keyed",
            scope="account",
            retention=timedelta(hours=24),
            after_error="nothing_applied",
            keys_durable=True,
            payload_checked=True,
            concurrent="conflict",
            max_key_length=255,
        ),
        response_binds="key",
        lookup=Lookup(kind="status_api", interval=timedelta(seconds=5)),
        success_proves="applied",
        request_timeout=request_timeout,
        max_in_flight=request_timeout * 2,
        source="Tickets API v1: Idempotency-Key <= 255 chars, kept 24 h with the ticket in one "
        "transaction; 422 idempotency_key_reused; 409 request_in_progress; the ticket names "
        "its key; GET /v1/requests/{key} from the same database",
    )


class TicketsAdapter:
    """Opens tickets in one Tickets account."""

    actions: tuple[str, ...] = (OPEN,)
    # a ticket in another queue is another act; the subject and body are wording
    intent_fields: ClassVar[Mapping[str, Sequence[str]]] = {OPEN: ("queue",)}
    payload_schemas: ClassVar[Mapping[str, Mapping[str, Any]]] = {OPEN: TICKET_SCHEMA}
    descriptions: ClassVar[Mapping[str, str]] = {
        OPEN: "Open a help-desk ticket; the target is the customer id. One ticket per "
        "customer and queue: asked again, the first one is returned.",
    }

    def __init__(
        self, base_url: str, *, token: str, account: str, contract: Contract | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.account = account
        # keys are unique per account: every attempt records where it was sent
        self.contract = scoped(contract or tickets_contract(), f"{account} at {self.base_url}")
        self._auth = {"Authorization": f"Bearer {token}"}
        # retries off; kept-alive connections only where a lost answer is safe to retry
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def dispatch(self, claim: Claim) -> Outcome:
        op = claim.operation
        if op.action != OPEN:
            return Rejected(code="unsupported_action", reason=f"Tickets has no {op.action}")
        try:
            response = self._client.post(
                f"{self.base_url}/v1/customers/{quote(op.target, safe='')}/tickets",
                content=claim.payload_canonical.encode(),  # the frozen bytes, on every retry
                headers={
                    **self._auth,
                    "Idempotency-Key": claim.idempotency_key,
                    "Content-Type": "application/json",
                },
            )
            if response.status_code == 201:
                return _confirmed(response)
            return outcome_for_http_status(response, CODES, provider="Tickets")
        except Exception as exc:  # a timeout, a reset, a body we cannot read: never raised
            return outcome_for_http_error(exc)

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        # every key the operation was sent under (an operator's retry may have given it a
        # new one): whichever opened the ticket confirms it
        keys = dict.fromkeys([operation.idempotency_key, *(a.idempotency_key for a in attempts)])
        try:
            answers = [self._request(key) for key in keys]
        except Exception as exc:  # a failed read is no evidence
            reason = outcome_for_http_error(exc).reason
            return LookupResult(verdict=INCONCLUSIVE, detail={"error": reason})
        for verdict in (CONFIRMED, PENDING):
            found = [a for a in answers if a.verdict == verdict]
            if found:
                return found[0]
        return answers[0]

    def _request(self, key: str) -> LookupResult:
        """What `GET /v1/requests/{key}` says of the request sent under `key`."""
        response = self._client.get(
            f"{self.base_url}/v1/requests/{quote(key, safe='')}", headers=self._auth
        )
        if response.status_code == 404 and error_code(response) == "no_such_request":
            # authoritative: the key and the ticket are written together, so no record of
            # the key means no ticket (any other 404, a wrong URL say, proves nothing)
            return LookupResult(verdict=ABSENT, binding=Binding(idempotency_key=key))
        if response.status_code != 200:
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        answer = response.json()
        state, ticket = answer.get("state"), answer.get("ticket")
        if state == "processing":
            return LookupResult(verdict=PENDING, binding=Binding(idempotency_key=key))
        if state == "succeeded" and isinstance(ticket, dict):
            return LookupResult(
                verdict=CONFIRMED,
                # asked by our key; a ticket naming another key contradicts it
                binding=_binding(ticket).model_copy(
                    update={"idempotency_key": ticket.get("idempotency_key") or key}
                ),
                result=_result(ticket),
                detail={"source": "status_api"},
            )
        code = str((answer.get("error") or {}).get("code", ""))
        if state == "failed" and code in CODES.definitive:
            return LookupResult(
                verdict=REJECTED, binding=Binding(idempotency_key=key), detail={"code": code}
            )
        return LookupResult(
            verdict=INCONCLUSIVE,
            binding=Binding(idempotency_key=key),
            detail={"state": state, "code": code},
        )

    def search_hint(self, operation: Operation) -> str:
        """What a person can look for in the Tickets app."""
        return (
            f"a ticket of customer {operation.target} opened with Idempotency-Key "
            f"{operation.idempotency_key} (GET /v1/requests/{operation.idempotency_key})"
        )

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, Any]]:
        """What `opledger contract check` sends: a ticket for a customer kept for checks."""
        return OPEN, "contract-check", {"queue": "general", "subject": f"check {variant}"}

    def close(self) -> None:
        self._client.close()


def _confirmed(response: httpx.Response) -> Confirmed:
    ticket = response.json()
    return Confirmed(
        receipt_id=str(ticket["id"]),
        binding=_binding(ticket),
        result=_result(ticket),
        detail={
            "status": response.status_code,
            "replayed": response.headers.get("idempotent-replayed") == "true",
        },
    )


def _binding(ticket: dict[str, Any]) -> Binding:
    """What a ticket ties together: the key it was opened under, itself, its customer."""
    key = ticket.get("idempotency_key")
    return Binding(
        idempotency_key=str(key) if key is not None else None,
        receipt_id=str(ticket["id"]),
        target=str(ticket["customer"]),
    )


def _result(ticket: dict[str, Any]) -> dict[str, Any]:
    """What the agent that asked learns: the ticket's id, queue and status."""
    return {k: ticket[k] for k in ("id", "queue", "status") if k in ticket}


def build_registry(settings: Settings) -> Registry:
    """The `OPLEDGER_ADAPTERS` factory: the bundled adapters, and Tickets beside them."""
    url, token = os.environ.get("TICKETS_URL"), os.environ.get("TICKETS_TOKEN")
    if not url or not token:
        raise ValueError("TICKETS_URL and TICKETS_TOKEN must both be set")
    registry = bundled_registry(settings)
    registry.register(
        TicketsAdapter(
            url,
            token=token,
            account=os.environ.get("TICKETS_ACCOUNT", "default"),
            contract=tickets_contract(timedelta(seconds=settings.provider_timeout_seconds)),
        )
    )
    return registry
