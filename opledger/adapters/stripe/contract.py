"""Stripe's contract as this adapter keeps it: the actions, the markers it writes in
metadata, what each error code means for a retry, and `stripe_contract()`."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from opledger.ledger.contract import Contract, Limits

from ..base import ErrorCodes
from ..presets import STRIPE_V1

PAYMENT_INTENT, CHARGE, REFUND = "stripe.payment_intent.v1", "stripe.charge.v1", "stripe.refund.v1"
ACTIONS: tuple[str, ...] = (PAYMENT_INTENT, CHARGE, REFUND)
#: the metadata keys this adapter writes; a payload may not set them
OP_MARKER, TARGET_MARKER = "opledger_op", "opledger_target"
#: what a lookup reads before it falls back to Search: 10 pages of 100 objects
LIST_PAGE, LIST_PAGES = 100, 10
#: how much earlier than the operation's creation a list read starts (clock skew)
CREATED_SLACK = timedelta(minutes=5)

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

#: the statuses of an object Stripe applied, by action
STATUS_CONFIRMED = {
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
            "read_after_write": True,  # the lists, read before Search
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


def key_scope(api_key: str, base_url: str) -> str:
    """Where our keys are unique: the account behind the secret key, named without the key
    (its mode and a fingerprint), at this endpoint."""
    mode = "live" if "_live_" in api_key else "test" if "_test_" in api_key else "unknown-mode"
    fingerprint = hashlib.sha256(api_key.encode()).hexdigest()[:12]
    return f"{mode} account of the key with sha256 {fingerprint}… at {base_url}"
