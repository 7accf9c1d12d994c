"""The webhook adapter: `webhook.post.v1`, used to tell people a review is waiting.

A generic webhook receiver promises nothing about duplicates unless you know it does: by
default the contract has no deduplication and no lookup, so an ambiguous delivery goes to
review rather than being sent twice. Every request carries an Idempotency-Key (the
operation's key), so a receiver that deduplicates can say so
(`OPLEDGER_REVIEW_WEBHOOK_DEDUPLICATES=true`) and get same-key retries.

With secrets, every request is signed (`Opledger-Signature`, docs/webhooks.md): an HMAC of
the exact body bytes and the time of this send. A retry sends the same frozen body under
the same key, signed again with its own timestamp.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import timedelta

import httpx
from pydantic import SecretStr

from opledger import signatures
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

from .base import (
    INCONCLUSIVE,
    SERVER_ERROR,
    Contract,
    ErrorCodes,
    Idempotency,
    Lookup,
    LookupResult,
    error_code,
    http_client,
    outcome_for_http_error,
    reuses_connections,
    throttled_outcome,
)

ACTIONS: tuple[str, ...] = ("webhook.post.v1",)


def webhook_contract(
    *,
    deduplicates: bool = False,
    request_timeout: timedelta = timedelta(seconds=10),
    max_in_flight: timedelta | None = None,
    retention: timedelta = timedelta(hours=24),
) -> Contract:
    return Contract(
        provider="webhook",
        effect="notification",
        idempotency=Idempotency(
            kind="keyed",
            scope="endpoint",
            retention=retention,
            after_error="replayed",
            keys_durable=True,
        )
        if deduplicates
        else Idempotency(kind="none"),
        lookup=Lookup(kind="none"),
        request_timeout=request_timeout,
        max_in_flight=max_in_flight or request_timeout * 2,
        source="a webhook receiver you configure; deduplication only if you say it does",
    )


class WebhookAdapter:
    """POSTs the frozen payload with its Idempotency-Key; signed when given `secrets`
    (the current one first, then a previous one while receivers move over).

    `clock` gives the Unix time each send is signed with (tests set it)."""

    actions = ACTIONS

    def __init__(
        self,
        url: str,
        *,
        contract: Contract | None = None,
        secrets: Sequence[SecretStr] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        for secret in secrets:
            problem = signatures.secret_problem(secret.get_secret_value())
            if problem is not None:
                raise ValueError(f"a webhook signing secret is refused: {problem}")
        self.url = url
        self.contract = contract or webhook_contract()
        self._secrets = tuple(secrets)
        self._clock = clock
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def headers(self, body: bytes, idempotency_key: str) -> dict[str, str]:
        """The headers of one send of `body`: signed now, when there are secrets."""
        headers = {"Idempotency-Key": idempotency_key, "Content-Type": "application/json"}
        if self._secrets:
            headers[signatures.HEADER] = signatures.signature_header(
                body, [s.get_secret_value() for s in self._secrets], int(self._clock())
            )
        return headers

    def dispatch(self, claim: Claim) -> Outcome:
        body = claim.payload_canonical.encode()
        try:
            response = self._client.post(
                self.url, content=body, headers=self.headers(body, claim.idempotency_key)
            )
        except Exception as exc:
            return outcome_for_http_error(exc)
        return self._outcome(claim, response)

    def _outcome(self, claim: Claim, response: httpx.Response) -> Outcome:
        status = response.status_code
        detail = {"status": status, "code": error_code(response)}
        if 200 <= status < 300:
            return Confirmed(
                receipt_id=f"{claim.idempotency_key}@webhook",
                binding=Binding(
                    idempotency_key=claim.idempotency_key, target=claim.operation.target
                ),
                detail=detail,
            )
        # a 429, or a 503 with Retry-After: the receiver asks us to come back later
        throttled = throttled_outcome(response, ErrorCodes(), provider="the receiver")
        if throttled is not None:
            return throttled
        if 400 <= status < 500 and status not in (408, 409, 425, 429):
            return Rejected(code=f"http_{status}", reason="the receiver refused it", detail=detail)
        code = SERVER_ERROR if status >= 500 else f"http_{status}"
        return Ambiguous(code=code, reason=f"HTTP {status}", detail=detail)

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        return LookupResult(verdict=INCONCLUSIVE, detail={"reason": "webhooks offer no lookup"})

    def close(self) -> None:
        self._client.close()
