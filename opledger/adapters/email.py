"""The email adapter: send over an HTTP API (Resend-like).

A 202 with a message id means the provider *accepted* the message (custody), not that it
was delivered; it is recorded as exactly that. Keys are optional; the provider answers a
reused key with a 409 whose error code tells "in progress" from "different payload". The
only lookup is a search of sent mail by a deterministic marker, which lags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import httpx

from opledger.ledger import (
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Operation,
    Outcome,
)

from .base import (
    CONFIRMED,
    INCONCLUSIVE,
    Contract,
    ErrorCodes,
    Idempotency,
    Limits,
    Lookup,
    LookupResult,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
)

ACTIONS: tuple[str, ...] = ("email.send.v1",)
#: the payload of an email: one recipient, a subject, a plain-text body
EMAIL_SCHEMA = {
    "type": "object",
    "properties": {
        "to": {"type": "string", "maxLength": 320, "description": "The recipient's address."},
        "subject": {"type": "string", "maxLength": 998},
        "text": {"type": "string", "description": "The plain-text body."},
    },
    "required": ["to"],
    "additionalProperties": False,
}
CODES = ErrorCodes(
    definitive=frozenset({"validation_error", "invalid_idempotency_key", "invalid_json"}),
    in_flight=frozenset({"concurrent_idempotent_requests"}),
    mismatch=frozenset({"invalid_idempotent_request"}),
    # the sandbox email API's answer (a 429) when the account is over its concurrency or rate
    throttled=frozenset({"rate_limited"}),
)


def email_contract(
    *,
    keys: bool = True,
    retention: timedelta = timedelta(hours=24),
    request_timeout: timedelta = timedelta(seconds=10),
    max_in_flight: timedelta | None = None,
    search_lag: timedelta = timedelta(seconds=30),
    lookup_interval: timedelta = timedelta(seconds=5),
    retention_margin: timedelta = timedelta(minutes=5),
    limits: Limits | None = None,
) -> Contract:
    """The sandbox email API's contract: keys kept in a durable store that replays stored
    errors, another payload and concurrent requests refused with their own 409 codes.

    `limits`: how hard our fleet may press on the account (none by default). Whatever they
    say, a "not now" sent nothing: the sandbox's limiter refuses a request over the
    account's limits (or while overloaded) before it reads the key or accepts a message."""
    return Contract(
        provider="email",
        effect="email",
        idempotency=Idempotency(
            kind="keyed",
            scope="account",
            retention=retention,
            after_error="replayed",
            keys_durable=True,
            payload_checked=True,
            concurrent="conflict",
            max_key_length=256,
        )
        if keys
        else Idempotency(kind="none"),
        lookup=Lookup(kind="search", lag=search_lag, interval=lookup_interval),
        # the message id answers the request on our connection with our key; a replay
        # comes only for the same key and body (the payload is checked)
        response_binds="key",
        success_proves="accepted",
        request_timeout=request_timeout,
        max_in_flight=max_in_flight or request_timeout * 2,
        retention_margin=retention_margin,
        limits=(limits or Limits()).model_copy(update={"throttle_applies_nothing": True}),
        source="opledger sandbox email API (Resend-like: 24 h keys, 409 codes; stored errors "
        "replayed; accepted is not delivered; its limiter answers 429 before anything is "
        "accepted)",
    )


def marker_for(operation: Operation) -> str:
    """The deterministic marker carried by the message: the operation's marker (its first
    key, derived from the intent: the same for the act asked again after a lost record)."""
    return operation.marker


class EmailAdapter:
    actions = ACTIONS
    payload_schemas: ClassVar[Mapping[str, Mapping[str, Any]]] = {ACTIONS[0]: EMAIL_SCHEMA}
    descriptions: ClassVar[Mapping[str, str]] = {
        ACTIONS[0]: "Send one email through the mail provider; the target is the recipient."
    }

    def __init__(self, base_url: str, *, account: str, contract: Contract | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.account = account
        self.contract = scoped(contract or email_contract(), f"{account} at {self.base_url}")
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def dispatch(self, claim: Claim) -> Outcome:
        body = {**claim.payload, "marker": marker_for(claim.operation)}
        headers = {"Content-Type": "application/json"}
        if self.contract.idempotency.kind == "keyed":
            headers["Idempotency-Key"] = claim.idempotency_key
        try:
            response = self._client.post(
                f"{self.base_url}/email/{self.account}/send", json=body, headers=headers
            )
            return self._outcome(claim, response)
        except Exception as exc:
            return outcome_for_http_error(exc)

    def _outcome(self, claim: Claim, response: httpx.Response) -> Outcome:
        status = response.status_code
        if status in (200, 202):
            return Confirmed(
                receipt_id=str(response.json()["id"]),
                binding=Binding(
                    idempotency_key=claim.idempotency_key, target=claim.operation.target
                ),
                accepted_only=True,
                result={"message_id": str(response.json()["id"])},
                detail={
                    "status": status,
                    "replayed": response.headers.get("idempotent-replayed") == "true",
                },
            )
        return outcome_for_http_status(response, CODES, provider="the email API")

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        marker = marker_for(operation)
        try:
            response = self._client.get(
                f"{self.base_url}/email/{self.account}/sent", params={"marker": marker}
            )
            hits = response.json().get("data", []) if response.status_code == 200 else []
        except Exception as exc:
            return LookupResult(
                verdict=INCONCLUSIVE, detail={"error": outcome_for_http_error(exc).reason}
            )
        for hit in hits:
            if hit.get("marker") == marker:
                return LookupResult(
                    verdict=CONFIRMED,
                    binding=Binding(
                        idempotency_key=operation.idempotency_key,
                        receipt_id=hit["id"],
                        target=operation.target,
                    ),
                    detail={"source": "search", "accepted_only": True},
                )
        return LookupResult(verdict=INCONCLUSIVE, detail={"source": "search", "hits": 0})

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, object]]:
        """What `opledger contract check` sends: a message to an address that cannot exist."""
        to = "contract-check@example.invalid"
        return ACTIONS[0], to, {"to": to, "subject": f"opledger contract check {variant}"}

    def close(self) -> None:
        self._client.close()
