"""What the adapter sends: the path and Stripe's form encoding of an operation's request,
with the operation's marker in its metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opledger.ledger import Operation

from .contract import OP_MARKER, PAYMENT_INTENT, REFUND, TARGET_MARKER


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
