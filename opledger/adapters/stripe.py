"""The Stripe adapter: payments and refunds over Stripe's API v1 (form-encoded POSTs).

Actions: `stripe.payment_intent.v1` (create a PaymentIntent and confirm it at once),
`stripe.charge.v1` (the older Charges API, for a `source` token or a customer's default
card) and `stripe.refund.v1` (refund a PaymentIntent `pi_...` or a charge `ch_...`, the
operation's target).

Contract: Stripe's documented v1 semantics (`presets.STRIPE_V1`): every POST carries our
key as `Idempotency-Key`, scoped to the account of the secret key; keys may be pruned once
24 h old; once execution began, the first response (a 400, a 402 decline or a 500 too) is
stored and replayed with `Idempotent-Replayed: true`; another body under a used key is an
`idempotency_error`; a request while another with the key executes is a 409
`idempotency_key_in_use`. Every object we create carries the operation's marker
(its first key, derived from the intent: the same for the act asked again after the ledger
lost its record; the operation id for operations recorded before keys were derived) in
`metadata[opledger_op]` (and a payment its target in `metadata[opledger_target]`): Stripe
echoes metadata in every answer, so a success names the operation it answers.

Stripe has no lookup by idempotency key. The lookup reads our marker back from a list
(`GET /v1/payment_intents|charges?created[gte]=...`, `GET /v1/refunds?charge|payment_intent=`),
which Stripe documents as the read-after-write path, and falls back to Search
(`metadata['opledger_op']:'...'`), which lags (normally under a minute, more during
outages), only where the list is too long to read. Finding the marker confirms; not
finding it proves nothing (Stripe may still finish a request that answered 500, and a
search may be behind), so the contract declares a lookup of kind "search". What is left
unknown after the in-flight deadline is resent under the same key while Stripe keeps it:
Stripe answers with the stored first response.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import httpx
from pydantic import SecretStr

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
from opledger.ledger.contract import Contract, Limits
from opledger.ledger.evidence import BINDING_MISMATCH
from opledger.net import api_key_problem

from .base import (
    CONFIRMED,
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    INCONCLUSIVE,
    REJECTED,
    ErrorCodes,
    LookupResult,
    http_client,
    outcome_for_http_error,
    outcome_for_http_status,
    reuses_connections,
    scoped,
    throttled_outcome,
)
from .presets import STRIPE_V1

PAYMENT_INTENT, CHARGE, REFUND = "stripe.payment_intent.v1", "stripe.charge.v1", "stripe.refund.v1"
ACTIONS: tuple[str, ...] = (PAYMENT_INTENT, CHARGE, REFUND)
#: the metadata keys this adapter writes; a payload may not set them
OP_MARKER, TARGET_MARKER = "opledger_op", "opledger_target"
#: what a lookup reads before it falls back to Search: 10 pages of 100 objects
LIST_PAGE, LIST_PAGES = 100, 10
#: how much earlier than the operation's creation a list read starts (clock skew)
CREATED_SLACK = timedelta(minutes=5)

_METADATA = {
    "type": "object",
    "description": "Your own key-value pairs, stored on the Stripe object (keys up to 40 "
    "characters, values up to 500; keys starting with opledger_ are reserved).",
    "propertyNames": {"maxLength": 40, "not": {"pattern": "^opledger_"}},
    "additionalProperties": {"type": "string", "maxLength": 500},
    "maxProperties": 48,
}
_AMOUNT = {
    "type": "integer",
    "minimum": 1,
    "description": "In the currency's smallest unit (cents for usd).",
}
_CURRENCY = {
    "type": "string",
    "pattern": "^[a-z]{3}$",
    "description": "Three-letter ISO code, lowercase.",
}
_DESCRIPTION = {"type": "string", "maxLength": 1000}
PAYMENT_INTENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount": _AMOUNT,
        "currency": _CURRENCY,
        "payment_method": {
            "type": "string",
            "description": "The PaymentMethod to charge (pm_...).",
        },
        "customer": {"type": "string", "description": "The Customer it belongs to (cus_...)."},
        "description": _DESCRIPTION,
        "return_url": {
            "type": "string",
            "description": "Where a customer returns after a redirect (3-D Secure); without "
            "it, payment methods that need a redirect are not offered.",
        },
        "metadata": _METADATA,
    },
    "required": ["amount", "currency", "payment_method"],
    "additionalProperties": False,
}
CHARGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount": _AMOUNT,
        "currency": _CURRENCY,
        "source": {"type": "string", "description": "A card token or source (tok_...)."},
        "customer": {
            "type": "string",
            "description": "The Customer to charge (its default card unless a source is given).",
        },
        "description": _DESCRIPTION,
        "metadata": _METADATA,
    },
    "required": ["amount", "currency"],
    "anyOf": [{"required": ["source"]}, {"required": ["customer"]}],
    "additionalProperties": False,
}
REFUND_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "amount": {**_AMOUNT, "description": "Part of the payment to refund; omitted: all."},
        "reason": {"enum": ["duplicate", "fraudulent", "requested_by_customer"]},
        "metadata": _METADATA,
    },
    "additionalProperties": False,
}

#: Stripe's error codes by what they mean for a retry. Declines (type `card_error`) and the
#: idempotency layer's answers (type `idempotency_error`) are told apart by their type.
CODES = ErrorCodes(
    definitive=frozenset(
        {
            "parameter_missing",
            "parameter_invalid_integer",
            "parameter_invalid_empty",
            "parameter_invalid_string_empty",
            "parameter_unknown",
            "parameters_exclusive",
            "amount_too_small",
            "amount_too_large",
            "invalid_charge_amount",
            "resource_missing",
            "missing",
            "payment_intent_unexpected_state",
            "payment_method_unactivated",
            "charge_disputed",
            "charge_expired_for_capture",
            "url_invalid",
        }
    ),
    # our own earlier refund (under another key) may have refunded it already
    conflicting_state=frozenset({"charge_already_refunded"}),
    in_flight=frozenset({"idempotency_key_in_use"}),
    # Stripe's "not now", both under 429: over the account's rate or concurrency limit, and
    # an object locked by another request or Stripe process (its libraries retry both)
    throttled=frozenset({"rate_limit", "lock_timeout"}),
)

_STATUS_CONFIRMED = {
    PAYMENT_INTENT: {"succeeded", "processing", "requires_capture", "requires_action"},
    CHARGE: {"succeeded", "pending"},
    REFUND: {"succeeded", "pending", "requires_action"},
}


def stripe_contract(
    *,
    request_timeout: timedelta | None = None,
    max_in_flight: timedelta | None = None,
    retention: timedelta | None = None,
    retention_margin: timedelta | None = None,
    lookup_lag: timedelta | None = None,
    lookup_interval: timedelta | None = None,
    limits: Limits | None = None,
) -> Contract:
    """Stripe v1's documented contract (`presets.STRIPE_V1`) as this adapter keeps it.

    Our client's numbers (timeout, in-flight bound, lookup interval, and `limits`: how hard
    our fleet may press on the account) may be set; that a 429 applied nothing is Stripe's
    fact and stays. Stripe's
    own: a retention longer than its 24 h is refused; a shorter lag is accepted (for tests
    against a mock: Stripe's Search can be an hour behind).
    Its answers name our operation (the metadata marker, from which the adapter binds our
    key), so the contract says responses bind the key.
    """
    base = STRIPE_V1
    documented = base.idempotency.retention
    assert documented is not None  # a keyed preset states it
    kept = retention if retention is not None else documented
    if kept > documented:
        raise ValueError(f"Stripe may prune keys after {documented}; a longer retention is unsafe")
    lag = lookup_lag if lookup_lag is not None else base.lookup.lag
    timeout = request_timeout if request_timeout is not None else base.request_timeout
    values = base.model_dump()
    values.update(
        idempotency={**values["idempotency"], "retention": kept},
        lookup={
            "kind": "search",
            "lag": lag,
            "interval": lookup_interval if lookup_interval is not None else base.lookup.interval,
        },
        response_binds="key",
        request_timeout=timeout,
        max_in_flight=max_in_flight
        if max_in_flight is not None
        else max(base.max_in_flight, timeout * 2),
        retention_margin=retention_margin
        if retention_margin is not None
        else min(base.retention_margin, kept / 10),
        limits=(limits or base.limits).model_copy(
            update={"throttle_applies_nothing": base.limits.throttle_applies_nothing}
        ),
        source=base.source
        + "; this adapter: the operation's marker in metadata, echoed in every answer (so a "
        "success binds our key); lookup = the list read back (read-after-write), Search beyond "
        f"{LIST_PAGE * LIST_PAGES} objects",
    )
    return Contract.model_validate(values)


def _accepted_only(obj: Mapping[str, Any]) -> bool:
    """Stripe took the request but the money has not moved yet (processing, pending, an
    authorization awaiting capture, a 3-D Secure step): confirmed, never to be sent again,
    but custody rather than a final payment."""
    return str(obj.get("status", "")) != "succeeded"


def key_scope(api_key: str, base_url: str) -> str:
    """Where our keys are unique: the account behind the secret key, named without the key
    (its mode and a fingerprint), at this endpoint."""
    mode = "live" if "_live_" in api_key else "test" if "_test_" in api_key else "unknown-mode"
    fingerprint = hashlib.sha256(api_key.encode()).hexdigest()[:12]
    return f"{mode} account of the key with sha256 {fingerprint}… at {base_url}"


class StripeAdapter:
    """PaymentIntents, charges and refunds in one Stripe account (the secret key's)."""

    actions = ACTIONS

    def __init__(
        self,
        base_url: str,
        *,
        api_key: SecretStr | str,
        contract: Contract | None = None,
        stripe_version: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = api_key if isinstance(api_key, SecretStr) else SecretStr(api_key)
        secret = self._key.get_secret_value()
        problem = api_key_problem(secret)
        if problem is not None:  # said without the key
            raise ValueError(f"a Stripe adapter needs a secret key, and this one {problem}")
        self.account = key_scope(secret, self.base_url)
        self.contract = scoped(contract or stripe_contract(), self.account)
        self._version = stripe_version
        # Stripe's test mode is the same endpoint under a test key: `contract check` may
        # send its probes there, never with a live key
        self.test_base_url = self.base_url if "_test_" in secret else None
        self.intent_fields = {
            PAYMENT_INTENT: ("amount", "currency", "customer", "payment_method"),
            CHARGE: ("amount", "currency", "customer", "source"),
            REFUND: ("amount",),
        }
        self.payload_schemas = {
            PAYMENT_INTENT: PAYMENT_INTENT_SCHEMA,
            CHARGE: CHARGE_SCHEMA,
            REFUND: REFUND_SCHEMA,
        }
        self.descriptions = {
            PAYMENT_INTENT: (
                "Charge a customer's payment method through a Stripe PaymentIntent, confirmed "
                "at once; the target is your reference for what is paid (an order or "
                "invoice id). Another amount, currency, customer or payment method is "
                "another payment; the same ones asked again are not charged twice."
            ),
            CHARGE: (
                "Charge a card token or a customer's default card with Stripe's Charges API; "
                "the target is your reference for what is paid. Another amount, currency, "
                "customer or source is another payment."
            ),
            REFUND: (
                "Refund a Stripe payment; the target is the PaymentIntent (pi_...) or "
                "charge (ch_...) id. Another amount is another refund."
            ),
        }
        self._client = http_client(
            self.contract.request_timeout.total_seconds(),
            reuse=reuses_connections(self.contract),
        )

    def __repr__(self) -> str:  # never the key
        return f"StripeAdapter({self.base_url!r}, account={self.account!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._key.get_secret_value()}"}
        if self._version:
            headers["Stripe-Version"] = self._version
        return headers

    # -- dispatch --------------------------------------------------------------------------

    def dispatch(self, claim: Claim) -> Outcome:
        op = claim.operation
        if op.action not in ACTIONS:
            return Rejected(
                code="unsupported_action", reason=f"the Stripe adapter has no {op.action}"
            )
        try:
            path, params = request_for(op, claim.payload)
        except ValueError as exc:  # refused here: nothing was sent
            return Rejected(code="invalid_payload", reason=str(exc)[:500])
        try:
            response = self._client.post(
                f"{self.base_url}{path}",
                content=urlencode(params).encode(),
                headers={
                    **self._headers(),
                    "Idempotency-Key": claim.idempotency_key,
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
            return self._outcome(claim, response)
        except Exception as exc:  # mapped at the edge, never leaked
            failed = outcome_for_http_error(exc)
            return failed.model_copy(update={"reason": self._scrubbed(failed.reason)})

    def _scrubbed(self, text: str) -> str:
        """`text` without the secret key (an exception may quote a header it refused)."""
        return text.replace(self._key.get_secret_value(), "[the secret key]")

    def _outcome(self, claim: Claim, response: httpx.Response) -> Outcome:
        op = claim.operation
        replayed = response.headers.get("idempotent-replayed") == "true"
        detail: dict[str, Any] = {"status": response.status_code, "replayed": replayed}
        request_id = response.headers.get("request-id")
        if request_id:
            detail["request_id"] = request_id
        if response.status_code == 200:
            body = response.json()
            if not isinstance(body, dict) or not isinstance(body.get("id"), str):
                return Ambiguous(code="unreadable_response", reason="a 200 without an object id")
            clash = _contradiction(op, claim.payload, body)
            if clash is not None:
                return Ambiguous(
                    code=BINDING_MISMATCH,
                    reason=f"Stripe's answer is about another request: {clash}",
                    detail={**detail, "object": body["id"]},
                )
            status = str(body.get("status", ""))
            if status and status not in _STATUS_CONFIRMED[op.action]:
                return Ambiguous(
                    code=f"status_{status}",
                    reason=f"Stripe created {body['id']} in status {status}",
                    detail={**detail, "result": _result(body)},
                )
            echoed = response.headers.get("idempotency-key")
            return Confirmed(
                receipt_id=body["id"],
                binding=_binding(op, body, echoed or claim.idempotency_key),
                accepted_only=_accepted_only(body),
                result=_result(body),
                detail=detail,
            )
        error = _error(response)
        kind, code = error.get("type", ""), error.get("code", "")
        detail.update(
            {
                "type": kind,
                "code": code,
                "decline_code": error.get("decline_code", ""),
                "should_retry": response.headers.get("stripe-should-retry", ""),
            }
        )
        throttled = throttled_outcome(response, CODES, provider="Stripe")
        if throttled is not None:  # before Stripe's own types: a 429 is never a decline
            return throttled.model_copy(update={"detail": {**throttled.detail, **detail}})
        if code in CODES.in_flight:
            return Ambiguous(
                code=IN_FLIGHT, reason="a request with this key is executing", detail=detail
            )
        if kind == "idempotency_error":
            return Ambiguous(
                code=IDEMPOTENCY_MISMATCH,
                reason="Stripe: this key was used with other parameters",
                detail=detail,
            )
        if kind == "card_error" and 400 <= response.status_code < 500:
            # a decline: Stripe ran the request and refused the payment (stored, replayed)
            return Rejected(
                code=code or "card_error",
                reason=f"Stripe declined: {error.get('decline_code') or code or 'card_error'}",
                detail=detail,
            )
        outcome = outcome_for_http_status(response, CODES, provider="Stripe")
        return outcome.model_copy(update={"detail": {**outcome.detail, **detail}})

    # -- lookup ----------------------------------------------------------------------------

    def lookup(self, operation: Operation, attempts: Sequence[Attempt]) -> LookupResult:
        try:
            return self._lookup(operation)
        except Exception as exc:  # a failed read is no evidence
            return LookupResult(
                verdict=INCONCLUSIVE,
                detail={"error": self._scrubbed(outcome_for_http_error(exc).reason)},
            )

    def _lookup(self, operation: Operation) -> LookupResult:
        action = operation.action
        if action == REFUND:
            field = "payment_intent" if operation.target.startswith("pi_") else "charge"
            path, params = "/v1/refunds", {field: operation.target}
        else:
            path = "/v1/payment_intents" if action == PAYMENT_INTENT else "/v1/charges"
            since = int((operation.created_at - CREATED_SLACK).timestamp())
            params = {"created[gte]": str(since)}
        found: list[dict[str, Any]] = []
        pages, after, complete = 0, None, False
        while pages < LIST_PAGES:
            query = {**params, "limit": str(LIST_PAGE)}
            if after:
                query["starting_after"] = after
            response = self._client.get(
                f"{self.base_url}{path}", params=query, headers=self._headers()
            )
            if response.status_code != 200:
                return LookupResult(
                    verdict=INCONCLUSIVE,
                    detail={
                        "source": "list",
                        "status": response.status_code,
                        "code": _error(response).get("code", ""),
                    },
                )
            page = response.json()
            data = [o for o in page.get("data", []) if isinstance(o, dict)]
            found += [o for o in data if _marker(o) == operation.marker]
            pages += 1
            if not page.get("has_more") or not data:
                complete = True
                break
            after = str(data[-1].get("id"))
        source = "list"
        if not found and not complete and action != REFUND:
            source = "search"  # too many to read: Stripe's search, which lags
            response = self._client.get(
                f"{self.base_url}{path}/search",
                params={"query": f"metadata['{OP_MARKER}']:'{operation.marker}'", "limit": "10"},
                headers=self._headers(),
            )
            if response.status_code == 200:
                found = [
                    o for o in response.json().get("data", []) if _marker(o) == operation.marker
                ]
        return self._verdict(operation, found, source, pages)

    def _verdict(
        self, operation: Operation, found: list[dict[str, Any]], source: str, pages: int
    ) -> LookupResult:
        if not found:
            # absence proves nothing: a search lags, and a request answered with a 500 may
            # still be completed by Stripe
            return LookupResult(
                verdict=INCONCLUSIVE, detail={"source": source, "hits": 0, "pages": pages}
            )
        applied = [
            o for o in found if str(o.get("status", "")) in _STATUS_CONFIRMED[operation.action]
        ]
        for obj in applied:
            clash = _contradiction(operation, None, obj)
            if clash is None:
                return LookupResult(
                    verdict=CONFIRMED,
                    binding=_binding(operation, obj, operation.idempotency_key),
                    result=_result(obj),
                    detail={
                        "source": source,
                        "hits": len(found),
                        "accepted_only": _accepted_only(obj),
                    },
                )
        declined = [o for o in found if _declined(operation.action, o)]
        if declined and len(declined) == len(found):
            # Stripe ran our request and declined it; the key replays that decline
            return LookupResult(
                verdict=REJECTED,
                binding=_binding(operation, declined[0], operation.idempotency_key),
                detail={"source": source, "result": _result(declined[0]), "code": "declined"},
            )
        return LookupResult(
            verdict=INCONCLUSIVE,
            detail={
                "source": source,
                "hits": len(found),
                "statuses": sorted({str(o.get("status")) for o in found}),
            },
        )

    def search_hint(self, operation: Operation) -> str | None:
        """What to search for in the Stripe dashboard (or its Search API)."""
        return f"metadata['{OP_MARKER}']:'{operation.marker}'"

    def contract_probe(self, variant: int) -> tuple[str, str, dict[str, Any]]:
        """What `opledger contract check` sends (test mode only): a charge of Stripe's test
        card token, whose amount differs with `variant`."""
        return (
            CHARGE,
            "opledger-contract-check",
            {"amount": 1000 + variant, "currency": "usd", "source": "tok_visa"},
        )

    def close(self) -> None:
        self._client.close()


# -- requests -------------------------------------------------------------------------------


def request_for(op: Operation, payload: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The path and form parameters of `op`'s request (ValueError: a payload we refuse)."""
    user_meta = payload.get("metadata") or {}
    if not isinstance(user_meta, Mapping):
        raise ValueError("metadata must be an object of strings")
    reserved = sorted(k for k in user_meta if str(k).startswith("opledger_"))
    if reserved:
        raise ValueError(f"metadata keys starting with opledger_ are reserved: {reserved}")
    metadata = {**user_meta, OP_MARKER: op.marker}
    if op.action == REFUND:
        field = "payment_intent" if op.target.startswith("pi_") else "charge"
        params: dict[str, Any] = {field: op.target}
        for name in ("amount", "reason"):
            if name in payload:
                params[name] = payload[name]
        params["metadata"] = metadata
        return "/v1/refunds", form(params)
    metadata[TARGET_MARKER] = op.target
    fields = ("amount", "currency", "customer", "description")
    params = {name: payload[name] for name in fields if name in payload}
    if op.action == PAYMENT_INTENT:
        params["payment_method"] = payload.get("payment_method")
        params["confirm"] = True
        if "return_url" in payload:
            params["return_url"] = payload["return_url"]
        else:  # confirmed server-side: only methods that need no redirect
            params["automatic_payment_methods"] = {"enabled": True, "allow_redirects": "never"}
        path = "/v1/payment_intents"
    else:
        if "source" in payload:
            params["source"] = payload["source"]
        path = "/v1/charges"
    params["metadata"] = metadata
    return path, form(params)


def form(params: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Stripe's form encoding: nested objects as `a[b]=c`, lists as `a[0]=c`, booleans as
    `true`/`false`; keys in a stable order (None values are left out)."""
    pairs: list[tuple[str, str]] = []
    for key in sorted(params):
        value = params[key]
        name = f"{prefix}[{key}]" if prefix else str(key)
        if value is None:
            continue
        if isinstance(value, Mapping):
            pairs += form(value, name)
        elif isinstance(value, list | tuple):
            pairs += form({str(i): v for i, v in enumerate(value)}, name)
        elif isinstance(value, bool):
            pairs.append((name, "true" if value else "false"))
        else:
            pairs.append((name, str(value)))
    return pairs


# -- answers --------------------------------------------------------------------------------


def _error(response: httpx.Response) -> dict[str, str]:
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return {}
    return {
        k: str(v)
        for k, v in error.items()
        if k in ("type", "code", "decline_code", "message") and v is not None
    }


def _marker(obj: Mapping[str, Any]) -> str | None:
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        value = metadata.get(OP_MARKER)
        return str(value) if value is not None else None
    return None


def _bound_target(op: Operation, obj: Mapping[str, Any]) -> str | None:
    """The target Stripe's object names: a refund's payment, a payment's target marker."""
    if op.action == REFUND:
        field = "payment_intent" if op.target.startswith("pi_") else "charge"
        value = obj.get(field)
        return str(value) if value is not None else None
    metadata = obj.get("metadata")
    value = metadata.get(TARGET_MARKER) if isinstance(metadata, Mapping) else None
    return str(value) if value is not None else None


def _contradiction(
    op: Operation, payload: Mapping[str, Any] | None, obj: Mapping[str, Any]
) -> str | None:
    """What in Stripe's object says it is not the answer to `op`'s request, or None."""
    marker = _marker(obj)
    if marker != op.marker:
        return f"it names operation {marker!r}" if marker else "it carries no operation marker"
    if payload is not None:
        for name in ("amount", "currency"):
            if name in payload and name in obj and str(obj[name]) != str(payload[name]):
                return f"its {name} is {obj[name]!r}, ours {payload[name]!r}"
    return None


def _binding(op: Operation, obj: Mapping[str, Any], key: str) -> Binding:
    """What Stripe's object ties: our key (through our operation's marker, or the key
    echoed in the response), the object, and the target it names."""
    return Binding(idempotency_key=key, receipt_id=str(obj["id"]), target=_bound_target(op, obj))


def _declined(action: str, obj: Mapping[str, Any]) -> bool:
    status = str(obj.get("status", ""))
    if action == PAYMENT_INTENT:
        return status == "requires_payment_method" and bool(obj.get("last_payment_error"))
    if action == CHARGE:
        return status == "failed"
    return False


def _result(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the agent is told: the object's id, amount, currency and status."""
    result = {k: obj[k] for k in ("id", "object", "amount", "currency", "status") if k in obj}
    for k in ("charge", "payment_intent"):
        if obj.get(k):
            result[k] = obj[k]
    return result
