"""What Stripe's answers say: a response mapped to an `Outcome`, and what an object Stripe
returns binds (our marker, the target it names, its status)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from opledger.ledger import Ambiguous, Binding, Claim, Confirmed, Operation, Outcome, Rejected
from opledger.ledger.evidence import BINDING_MISMATCH

from ..base import (
    IDEMPOTENCY_MISMATCH,
    IN_FLIGHT,
    outcome_for_http_status,
    throttled_outcome,
)
from .contract import (
    CHARGE,
    CODES,
    OP_MARKER,
    PAYMENT_INTENT,
    REFUND,
    STATUS_CONFIRMED,
    TARGET_MARKER,
)


def outcome_of(claim: Claim, response: httpx.Response) -> Outcome:
    """What Stripe's answer to `claim`'s request means."""
    replayed = response.headers.get("idempotent-replayed") == "true"
    detail: dict[str, Any] = {"status": response.status_code, "replayed": replayed}
    request_id = response.headers.get("request-id")
    if request_id:
        detail["request_id"] = request_id
    if response.status_code == 200:
        return _success(claim, response, detail)
    return _failure(response, detail)


def _success(claim: Claim, response: httpx.Response, detail: dict[str, Any]) -> Outcome:
    op = claim.operation
    body = response.json()
    if not isinstance(body, dict) or not isinstance(body.get("id"), str):
        return Ambiguous(code="unreadable_response", reason="a 200 without an object id")
    clash = contradiction(op, claim.payload, body)
    if clash is not None:
        return Ambiguous(
            code=BINDING_MISMATCH,
            reason=f"Stripe's answer is about another request: {clash}",
            detail={**detail, "object": body["id"]},
        )
    status = str(body.get("status", ""))
    if status and status not in STATUS_CONFIRMED[op.action]:
        return Ambiguous(
            code=f"status_{status}",
            reason=f"Stripe created {body['id']} in status {status}",
            detail={**detail, "result": result_of(body)},
        )
    echoed = response.headers.get("idempotency-key")
    return Confirmed(
        receipt_id=body["id"],
        binding=binding(op, body, echoed or claim.idempotency_key),
        accepted_only=accepted_only(body),
        result=result_of(body),
        detail=detail,
    )


def _failure(response: httpx.Response, detail: dict[str, Any]) -> Outcome:
    error = error_of(response)
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


def accepted_only(obj: Mapping[str, Any]) -> bool:
    """Stripe took the request but the money has not moved yet (processing, pending, an
    authorization awaiting capture, a 3-D Secure step): confirmed, never to be sent again,
    but custody rather than a final payment."""
    return str(obj.get("status", "")) != "succeeded"


def error_of(response: httpx.Response) -> dict[str, str]:
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


def marker_of(obj: Mapping[str, Any]) -> str | None:
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


def contradiction(
    op: Operation, payload: Mapping[str, Any] | None, obj: Mapping[str, Any]
) -> str | None:
    """What in Stripe's object says it is not the answer to `op`'s request, or None."""
    marker = marker_of(obj)
    if marker != op.marker:
        return f"it names operation {marker!r}" if marker else "it carries no operation marker"
    if payload is not None:
        for name in ("amount", "currency"):
            if name in payload and name in obj and str(obj[name]) != str(payload[name]):
                return f"its {name} is {obj[name]!r}, ours {payload[name]!r}"
    return None


def binding(op: Operation, obj: Mapping[str, Any], key: str) -> Binding:
    """What Stripe's object ties: our key (through our operation's marker, or the key
    echoed in the response), the object, and the target it names."""
    return Binding(idempotency_key=key, receipt_id=str(obj["id"]), target=_bound_target(op, obj))


def declined(action: str, obj: Mapping[str, Any]) -> bool:
    status = str(obj.get("status", ""))
    if action == PAYMENT_INTENT:
        return status == "requires_payment_method" and bool(obj.get("last_payment_error"))
    if action == CHARGE:
        return status == "failed"
    return False


def result_of(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the agent is told: the object's id, amount, currency and status."""
    result = {k: obj[k] for k in ("id", "object", "amount", "currency", "status") if k in obj}
    for k in ("charge", "payment_intent"):
        if obj.get(k):
            result[k] = obj[k]
    return result
