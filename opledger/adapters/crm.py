"""The CRM adapter: close or update a case over HTTP.

Contract: an Idempotency-Key scoped to the account, kept for a retention window, whose
first response (a 500 included) is stored and replayed; a 409 while the first request
with the key executes; an authoritative status endpoint by key; a receipt that binds the
resulting record version.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

import httpx

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
    ABSENT,
    CONFIRMED,
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    INCONCLUSIVE,
    PENDING,
    REJECTED,
    SERVER_ERROR,
    Contract,
    Idempotency,
    Lookup,
    LookupResult,
    error_code,
    http_client,
    outcome_for_http_error,
)

VERBS = {"close_case.v1": "close", "update_case.v1": "update"}
DEFINITIVE = {"case_not_found", "case_already_closed", "validation_error", "invalid_json"}


def crm_contract(
    *,
    keys: bool = True,
    lookup: Literal["status_api", "search", "none"] = "status_api",
    retention: timedelta = timedelta(hours=24),
    request_timeout: timedelta = timedelta(seconds=10),
    max_in_flight: timedelta | None = None,
    search_lag: timedelta = timedelta(seconds=5),
    lookup_interval: timedelta = timedelta(seconds=5),
    retention_margin: timedelta = timedelta(minutes=5),
    provider: str = "crm",
) -> Contract:
    """The CRM's contract as configured: each protection the provider offers, or not."""
    return Contract(
        provider=provider,
        idempotency=Idempotency(
            kind="keyed",
            scope="account",
            retention=retention,
            errors_replayed=True,
            replay_returns="stored_response",
            concurrent_conflict=True,
            max_key_length=255,
        )
        if keys
        else Idempotency(kind="none"),
        lookup=Lookup(
            kind=lookup,
            lag=search_lag if lookup == "search" else timedelta(0),
            interval=lookup_interval,
        ),
        success_proves="applied",
        request_timeout=request_timeout,
        max_in_flight=max_in_flight or request_timeout * 2,
        retention_margin=retention_margin,
        source="opledger sandbox CRM (Stripe v1-like key semantics)",
    )


class CrmAdapter:
    """Case actions against a CRM account over HTTP: `<namespace>.close_case.v1` and
    `<namespace>.update_case.v1` (the namespace is "crm" unless several CRM accounts with
    different contracts are registered side by side)."""

    def __init__(
        self,
        base_url: str,
        *,
        account: str,
        contract: Contract | None = None,
        namespace: str = "crm",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.account = account
        self.contract = contract or crm_contract()
        self._verbs = {f"{namespace}.{name}": verb for name, verb in VERBS.items()}
        self.actions: tuple[str, ...] = tuple(self._verbs)
        self._client = http_client(self.contract.request_timeout.total_seconds())

    def _url(self, path: str) -> str:
        return f"{self.base_url}/crm/{self.account}{path}"

    def dispatch(self, claim: Claim) -> Outcome:
        op = claim.operation
        verb = self._verbs.get(op.action)
        if verb is None:
            return Rejected(code="unsupported_action", reason=f"the CRM adapter has no {op.action}")
        try:
            response = self._client.post(
                self._url(f"/cases/{op.target}/{verb}"),
                content=claim.payload_canonical.encode(),
                headers={"Idempotency-Key": claim.key, "Content-Type": "application/json"},
            )
            return self._outcome(claim, response)
        except Exception as exc:  # mapped at the edge, never leaked
            return outcome_for_http_error(exc)

    def _outcome(self, claim: Claim, response: httpx.Response) -> Outcome:
        replayed = response.headers.get("idempotent-replayed") == "true"
        status, code = response.status_code, error_code(response)
        if status in (200, 201):
            body = response.json()
            return Confirmed(
                receipt_id=f"{body['case_id']}@v{body['version']}",
                binding=Binding(
                    key=body.get("idempotency_key"),
                    target=body["case_id"],
                    resulting_version=str(body["version"]),
                ),
                detail={"status": status, "replayed": replayed},
            )
        detail = {"status": status, "code": code, "replayed": replayed}
        if status == 409 and code == "idempotency_key_in_use":
            return Ambiguous(code=IN_FLIGHT, reason="a request with this key is executing")
        if status == 422 and code == "idempotency_key_reused":
            return Ambiguous(
                code=IDEMPOTENCY_MISMATCH, reason="key used with another payload", detail=detail
            )
        if code in DEFINITIVE and 400 <= status < 500:
            return Rejected(code=code, reason=f"the CRM refused: {code}", detail=detail)
        if status >= 500:
            return Ambiguous(
                code=SERVER_ERROR, reason=f"HTTP {status}", replayed=replayed, detail=detail
            )
        return Ambiguous(code=code or f"http_{status}", reason=f"HTTP {status}", detail=detail)

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        try:
            if self.contract.lookup.kind == "status_api":
                return self._status(operation)
            if self.contract.lookup.kind == "search":
                return self._search(operation)
            return LookupResult(verdict=INCONCLUSIVE, detail={"reason": "no lookup configured"})
        except Exception as exc:  # a failed read is no evidence
            return LookupResult(
                verdict=INCONCLUSIVE, detail={"error": outcome_for_http_error(exc).reason}
            )

    def _status(self, operation: Operation) -> LookupResult:
        key = operation.provider_request_id
        response = self._client.get(self._url(f"/requests/{key}"))
        if response.status_code == 404 and error_code(response) == "no_such_request":
            return LookupResult(verdict=ABSENT, binding=Binding(key=key), detail={"status": 404})
        if response.status_code == 202:
            return LookupResult(verdict=PENDING, binding=Binding(key=key))
        if response.status_code != 200:
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        stored = response.json()
        body, code = stored.get("response", {}), stored.get("status_code")
        if code in (200, 201):
            return LookupResult(
                verdict=CONFIRMED,
                binding=Binding(
                    key=body.get("idempotency_key"),
                    receipt_id=f"{body['case_id']}@v{body['version']}",
                    target=body.get("case_id"),
                    resulting_version=str(body.get("version")),
                ),
                detail={"source": "status_api", "stored_status": code},
            )
        err = (body.get("error") or {}).get("code", "")
        if isinstance(code, int) and 400 <= code < 500 and err in DEFINITIVE:
            return LookupResult(
                verdict=REJECTED,
                binding=Binding(key=key),
                detail={"stored_status": code, "code": err},
            )
        return LookupResult(
            verdict=INCONCLUSIVE,
            binding=Binding(key=key),
            detail={"stored_status": code, "code": err},
        )

    def _search(self, operation: Operation) -> LookupResult:
        key = operation.provider_request_id
        response = self._client.get(self._url("/search"), params={"key": key})
        if response.status_code != 200:
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        for hit in response.json().get("results", []):
            if hit.get("last_key") == key and hit.get("case_id") == operation.target:
                return LookupResult(
                    verdict=CONFIRMED,
                    binding=Binding(
                        key=key, target=hit["case_id"], resulting_version=str(hit["version"])
                    ),
                    detail={"source": "search"},
                )
        # Absent from a lagging search, or a case in the right state without our key (someone
        # else may have closed it): neither proves anything.
        return LookupResult(verdict=INCONCLUSIVE, detail={"source": "search", "hits": 0})

    def close(self) -> None:
        self._client.close()
