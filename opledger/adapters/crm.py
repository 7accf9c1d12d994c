"""The CRM adapter: close or update a case over HTTP.

Contract (the sandbox CRM's, Stripe v1-like): an Idempotency-Key scoped to the account,
kept for a retention window in a durable store, whose first response (a 500 included) is
stored and replayed; another payload under a used key refused (422); a 409 while the first
request with the key executes; an authoritative status endpoint by key; responses that
name our key and the digest of the body they executed, and a receipt that binds the
resulting record version. "Already closed" is a conflicting state: after an earlier
attempt that may have applied, it is most likely our own.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal

import httpx

from opledger.ledger import (
    Attempt,
    Binding,
    Claim,
    Confirmed,
    Operation,
    Outcome,
    Rejected,
)
from opledger.ledger.contract import AfterError, Concurrent, ResponseBinds

from .base import (
    ABSENT,
    CONFIRMED,
    INCONCLUSIVE,
    PENDING,
    REJECTED,
    Contract,
    ErrorCodes,
    Idempotency,
    Limits,
    Lookup,
    LookupResult,
    error_code,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
)

VERBS = {"close_case.v1": "close", "update_case.v1": "update"}
_NOTE = {"type": "string", "maxLength": 4000, "description": "Why, for the case's history."}
CLOSE_SCHEMA = {
    "type": "object",
    "properties": {"note": _NOTE},
    "additionalProperties": False,
}
UPDATE_SCHEMA = {
    "type": "object",
    "properties": {
        "fields": {
            "type": "object",
            "description": "The case fields to set, by name.",
            "additionalProperties": {"type": ["string", "number", "boolean", "null"]},
            "minProperties": 1,
        },
        "note": _NOTE,
    },
    "required": ["fields"],
    "additionalProperties": False,
}
CODES = ErrorCodes(
    definitive=frozenset(
        {"case_not_found", "validation_error", "invalid_json", "invalid_idempotency_key"}
    ),
    conflicting_state=frozenset({"case_already_closed"}),
    in_flight=frozenset({"idempotency_key_in_use"}),
    mismatch=frozenset({"idempotency_key_reused"}),
    # the sandbox CRM's answer (a 429) when the account is over its concurrency or rate
    throttled=frozenset({"rate_limited"}),
)


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
    scope: str = "account",
    after_error: AfterError = "replayed",
    keys_durable: bool = True,
    payload_checked: bool = True,
    concurrent: Concurrent = "conflict",
    conflict_wait: timedelta = timedelta(0),
    response_binds: ResponseBinds = "key_and_digest",
    max_key_length: int | None = None,
    limits: Limits | None = None,
) -> Contract:
    """The CRM's contract as configured: each protection the provider offers, or not.

    `limits`: how hard our fleet may press on the account (none by default). Whatever they
    say, a "not now" applied nothing: the sandbox CRM refuses a request over its limits (or
    while overloaded) before it reads the key or changes anything."""
    return Contract(
        provider=provider,
        effect="change to the case",
        idempotency=Idempotency(
            kind="keyed",
            scope=scope,
            retention=retention,
            after_error=after_error,
            keys_durable=keys_durable,
            payload_checked=payload_checked,
            concurrent=concurrent,
            conflict_wait=conflict_wait,
            max_key_length=max_key_length,
        )
        if keys
        else Idempotency(kind="none"),
        response_binds=response_binds,
        lookup=Lookup(
            kind=lookup,
            lag=search_lag if lookup == "search" else timedelta(0),
            interval=lookup_interval,
        ),
        success_proves="applied",
        request_timeout=request_timeout,
        max_in_flight=max_in_flight or request_timeout * 2,
        retention_margin=retention_margin,
        limits=(limits or Limits()).model_copy(update={"throttle_applies_nothing": True}),
        source="opledger sandbox CRM (Stripe v1-like key semantics; its limiter answers 429 "
        "before anything is applied)",
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
        self.contract = scoped(contract or crm_contract(), f"{account} at {self.base_url}")
        self._verbs = {f"{namespace}.{name}": verb for name, verb in VERBS.items()}
        self.actions: tuple[str, ...] = tuple(self._verbs)
        # what makes another act on the same case: the fields an update sets (a note is
        # wording); a close of a case is one act whatever its note says
        self.intent_fields = {f"{namespace}.update_case.v1": ("fields",)}
        # closing a case is one act whatever run or agent asks (a second thread picking up
        # the same ticket closes nothing twice); an update is one act per run: a later run
        # may set a field back to a value an earlier run set, and must be able to
        self.intent_scopes = {f"{namespace}.close_case.v1": "tenant"}
        self.payload_schemas = {
            f"{namespace}.close_case.v1": CLOSE_SCHEMA,
            f"{namespace}.update_case.v1": UPDATE_SCHEMA,
        }
        self.descriptions = {
            f"{namespace}.close_case.v1": "Close a CRM case; the target is the case id.",
            f"{namespace}.update_case.v1": (
                "Set fields of a CRM case; the target is the case id. Each set of field "
                "values is one act: the same values asked again are not applied twice."
            ),
        }
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

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
                headers={
                    "Idempotency-Key": claim.idempotency_key,
                    "Content-Type": "application/json",
                },
            )
            return self._outcome(claim, response)
        except Exception as exc:  # mapped at the edge, never leaked
            return outcome_for_http_error(exc)

    def _outcome(self, claim: Claim, response: httpx.Response) -> Outcome:
        status = response.status_code
        if status in (200, 201):
            body = response.json()
            return Confirmed(
                receipt_id=f"{body['case_id']}@v{body['version']}",
                binding=_binding(body),
                result=_result(body),
                detail={
                    "status": status,
                    "replayed": response.headers.get("idempotent-replayed") == "true",
                },
            )
        return outcome_for_http_status(response, CODES, provider="the CRM")

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        try:
            if self.contract.lookup.kind == "status_api":
                # every key this operation was sent with (an operator's retry may have
                # given it a new one): whichever applied the change confirms it
                keys = dict.fromkeys(
                    [operation.idempotency_key, *(a.idempotency_key for a in attempts)]
                )
                results = [self._status(operation, key) for key in keys]
                found = [r for r in results if r.verdict == CONFIRMED]
                return found[0] if found else results[0]
            if self.contract.lookup.kind == "search":
                return self._search(operation)
            return LookupResult(verdict=INCONCLUSIVE, detail={"reason": "no lookup configured"})
        except Exception as exc:  # a failed read is no evidence
            return LookupResult(
                verdict=INCONCLUSIVE, detail={"error": outcome_for_http_error(exc).reason}
            )

    def _status(self, operation: Operation, key: str) -> LookupResult:
        response = self._client.get(self._url(f"/requests/{key}"))
        if response.status_code == 404 and error_code(response) == "no_such_request":
            return LookupResult(
                verdict=ABSENT, binding=Binding(idempotency_key=key), detail={"status": 404}
            )
        if response.status_code == 202:
            return LookupResult(verdict=PENDING, binding=Binding(idempotency_key=key))
        if response.status_code != 200:
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        stored = response.json()
        body, code = stored.get("response", {}), stored.get("status_code")
        if code in (200, 201) and isinstance(body, dict) and "case_id" in body:
            return LookupResult(
                verdict=CONFIRMED,
                # asked by our key, the answer is about our key even where the body does
                # not repeat it (a body naming another key still contradicts it)
                binding=_binding(body).model_copy(
                    update={
                        "receipt_id": f"{body['case_id']}@v{body['version']}",
                        "idempotency_key": body.get("idempotency_key") or key,
                    }
                ),
                result=_result(body),
                detail={"source": "status_api", "stored_status": code},
            )
        err = (body.get("error") or {}).get("code", "") if isinstance(body, dict) else ""
        detail = {"stored_status": code, "code": err}
        if isinstance(code, int) and 400 <= code < 500 and err in CODES.definitive:
            return LookupResult(
                verdict=REJECTED, binding=Binding(idempotency_key=key), detail=detail
            )
        if isinstance(code, int) and 400 <= code < 500 and err in CODES.conflicting_state:
            return LookupResult(
                verdict=REJECTED,
                binding=Binding(idempotency_key=key),
                detail={**detail, "conflicting_state": True},
            )
        if (
            isinstance(code, int)
            and code >= 500
            and stored.get("applied") is False
            and self.contract.idempotency.after_error == "replayed"
        ):
            # the CRM's own records: this request failed without taking effect, and the
            # key replays that failure, so it never will: a definitive "not done"
            return LookupResult(
                verdict=REJECTED,
                binding=Binding(idempotency_key=key),
                detail={**detail, "code": "failed_without_effect"},
            )
        return LookupResult(
            verdict=INCONCLUSIVE, binding=Binding(idempotency_key=key), detail=detail
        )

    def _search(self, operation: Operation) -> LookupResult:
        key = operation.idempotency_key
        response = self._client.get(self._url("/search"), params={"key": key})
        if response.status_code != 200:
            return LookupResult(verdict=INCONCLUSIVE, detail={"status": response.status_code})
        for hit in response.json().get("results", []):
            if hit.get("last_key") == key and hit.get("case_id") == operation.target:
                # the body it executed binds it to our payload: a change someone else made
                # under our key (another body) confirms nothing
                digest = hit.get("last_digest")
                return LookupResult(
                    verdict=CONFIRMED,
                    binding=Binding(
                        idempotency_key=key,
                        target=hit["case_id"],
                        payload_digest=str(digest) if digest is not None else None,
                        resulting_version=str(hit["version"]),
                    ),
                    detail={"source": "search"},
                )
        # Absent from a lagging search, or a case in the right state without our key (someone
        # else may have closed it): neither proves anything.
        return LookupResult(verdict=INCONCLUSIVE, detail={"source": "search", "hits": 0})

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, object]]:
        """What `opledger contract check` sends: an update of a case kept for checks."""
        action = next(a for a, verb in self._verbs.items() if verb == "update")
        return action, "opledger-contract-check", {"fields": {"opledger_check": variant}}

    def close(self) -> None:
        self._client.close()


def _binding(body: dict[str, object]) -> Binding:
    """What a CRM success body ties together: our key, the body it executed, the case and
    the version it produced (each only when the CRM names it)."""
    key, digest = body.get("idempotency_key"), body.get("request_digest")
    return Binding(
        idempotency_key=str(key) if key is not None else None,
        payload_digest=str(digest) if digest is not None else None,
        target=str(body["case_id"]),
        resulting_version=str(body["version"]),
    )


def _result(body: dict[str, object]) -> dict[str, object]:
    """What the change produced, for the agent that asked: the case's status and version."""
    return {k: body[k] for k in ("case_id", "status", "version") if k in body}
