"""The payloads each Stripe action takes, as JSON Schema (what an agent is shown)."""

from __future__ import annotations

from typing import Any

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
