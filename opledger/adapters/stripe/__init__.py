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

The parts: `contract` (the actions, the markers, the error codes, `stripe_contract()`),
`schemas` (the payloads), `request` (the form we send), `answers` (a response mapped to an
outcome, what an object binds), `lookup` (the marker read back), `adapter` (the class).
"""

from __future__ import annotations

from .adapter import StripeAdapter
from .contract import (
    ACTIONS,
    CHARGE,
    CODES,
    OP_MARKER,
    PAYMENT_INTENT,
    REFUND,
    TARGET_MARKER,
    key_scope,
    stripe_contract,
)
from .request import form, request_for
from .schemas import CHARGE_SCHEMA, PAYMENT_INTENT_SCHEMA, REFUND_SCHEMA

__all__ = [
    "ACTIONS",
    "CHARGE",
    "CHARGE_SCHEMA",
    "CODES",
    "OP_MARKER",
    "PAYMENT_INTENT",
    "PAYMENT_INTENT_SCHEMA",
    "REFUND",
    "REFUND_SCHEMA",
    "TARGET_MARKER",
    "StripeAdapter",
    "form",
    "key_scope",
    "request_for",
    "stripe_contract",
]
