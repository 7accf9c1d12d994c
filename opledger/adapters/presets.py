"""Retry contracts of real providers, as their public documentation describes them.

Start an adapter for one of these from its preset, then check the endpoint and API
version you call: contracts differ between endpoints of one provider. Where a provider
does not document a number we choose the cautious reading and say so in `source`.
Timeouts and in-flight bounds are our client's choices, not the provider's.
"""

from __future__ import annotations

from datetime import timedelta

from opledger.ledger.contract import Contract, Idempotency, Limits, Lookup

H = timedelta(hours=1)
D = timedelta(days=1)
_timeout = timedelta(seconds=30)
_in_flight = timedelta(minutes=2)

STRIPE_V1 = Contract(
    provider="stripe.v1",
    effect="payment",
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=24 * H,
        after_error="replayed",
        keys_durable=True,
        payload_checked=True,
        concurrent="conflict",
        max_key_length=255,
        marks_replays=True,
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=1), read_after_write=True),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    # Stripe's rate and concurrency limiters answer 429 before an endpoint starts executing,
    # and a result is stored under the key only once execution began: a 429 applied nothing
    limits=Limits(throttle_applies_nothing=True),
    source="Stripe API v1: keys per account, may be pruned after 24 h; once execution began the "
    "first response (400/500 included) is stored and replayed; another payload gets an "
    "idempotency_error; 409 idempotency_key_in_use; keys <= 255 chars; every replay is marked "
    "Idempotent-Replayed: true; no lookup by key, search "
    "normally < 1 min behind, up to an hour during outages, lists read-after-write; 429 from "
    "the rate and concurrency limiters before execution, never stored under the key "
    "(docs.stripe.com idempotent_requests, error-low-level, search, rate-limits)",
)

STRIPE_V2 = Contract(
    provider="stripe.v2",
    effect="payment",
    idempotency=Idempotency(
        kind="keyed",
        scope="account + API + sandbox",
        retention=30 * D,
        after_error="rerun_failed",
        keys_durable=True,
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=1)),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Stripe API v2: keys 30 days; failed or partly failed work is re-executed, a success "
    "is not repeated; payload check and concurrent requests not documented (cautious: "
    "unchecked); a durable key store assumed for a hosted API; lists eventually consistent "
    "(docs.stripe.com api-v2-overview)",
)

PAYPAL_ORDERS = Contract(
    provider="paypal.orders.v2",
    effect="payment",
    idempotency=Idempotency(
        kind="keyed",
        scope="PayPal-Request-Id per API",
        retention=6 * H,
        after_error="rerun_failed",
        keys_durable=True,
    ),
    lookup=Lookup(kind="search", lag=3 * H),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="PayPal Orders v2: PayPal-Request-Id kept 6 h (72 h on request); a retry returns the "
    "latest status of the first request, retry on timeouts and 5xx while the id is kept; "
    "payload check not documented for v2 (cautious: unchecked); a durable key store assumed "
    "for a hosted API; Transaction Search up to 3 h behind (developer.paypal.com idempotency)",
)

ADYEN = Contract(
    provider="adyen",
    effect="payment",
    idempotency=Idempotency(
        kind="keyed",
        scope="company account, per regional endpoint",
        retention=31 * D,
        after_error="key_released",
        keys_durable=True,
        max_key_length=64,
    ),
    lookup=Lookup(kind="none"),
    response_binds="key",
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Adyen: Idempotency-Key <= 64 chars, at least 31 days, first response returned, key "
    "echoed in the response, not checked across regions; what a transient error does to the key "
    "is not documented (cautious: released); a durable key store assumed for a hosted API; "
    "webhooks for lost responses (docs.adyen.com api-idempotency)",
)

RESEND = Contract(
    provider="resend",
    effect="email",
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=24 * H,
        after_error="key_released",
        keys_durable=True,
        payload_checked=True,
        concurrent="conflict",
        max_key_length=256,
    ),
    lookup=Lookup(kind="none"),
    success_proves="accepted",
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Resend POST /emails: Idempotency-Key <= 256 chars, 24 h; 409 "
    "invalid_idempotent_request (other payload) vs concurrent_idempotent_requests; replay "
    "returns the same email id; errors "
    "not documented (cautious: released); a durable key store assumed for a hosted API; GET "
    "/emails/{id} needs the id, so it is no lookup by key (resend.com docs)",
)

SENDGRID = Contract(
    provider="sendgrid",
    effect="email",
    idempotency=Idempotency(kind="none"),
    lookup=Lookup(kind="search", lag=timedelta(minutes=10), interval=timedelta(seconds=10)),
    success_proves="accepted",
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="SendGrid v3 mail/send: no idempotency key found; 202 = queued, not delivered; Email "
    "Activity search by msg_id (paid, 6 req/min, lag not documented: 10 min assumed)",
)

SES = Contract(
    provider="ses.v2",
    effect="email",
    idempotency=Idempotency(kind="none"),
    lookup=Lookup(kind="none"),
    success_proves="accepted",
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Amazon SES v2 SendEmail: no client token; SES may accept without sending; turn the "
    "AWS SDK's own retries off (docs.aws.amazon.com SES API v2, sdkref retry behavior)",
)

SMTP = Contract(
    provider="smtp",
    effect="email",
    idempotency=Idempotency(kind="none"),
    lookup=Lookup(kind="none"),
    success_proves="accepted",
    request_timeout=_timeout,
    max_in_flight=timedelta(minutes=10),
    source="RFC 5321: 250 after DATA is custody; up to 10 minutes for it; no dedup on "
    "Message-ID (RFC 5322 §3.6.4)",
)

ZENDESK = Contract(
    provider="zendesk",
    effect="change to the ticket",
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=2 * H,
        after_error="key_released",
        keys_durable=True,
        payload_checked=True,
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=5)),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Zendesk POST /api/v2/tickets: Idempotency-Key, x-idempotency-lookup hit/miss, "
    "mismatch 400 IdempotentRequestError, keys expire after 2 h (SDK); errors and concurrent "
    "requests not documented (cautious); a durable key store assumed for a hosted API; search "
    "lags minutes",
)

SHOPIFY = Contract(
    provider="shopify.admin",
    effect="change to the order",
    idempotency=Idempotency(
        kind="keyed",
        scope="shop",
        retention=24 * H,
        after_error="replayed",
        keys_durable=True,
        payload_checked=True,
        concurrent="conflict",
        failed_attempt_poisons_key=True,
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Shopify Admin GraphQL @idempotent: IDEMPOTENCY_CONCURRENT_REQUEST, "
    "IDEMPOTENCY_KEY_PARAMETER_MISMATCH, IDEMPOTENCY_PREVIOUS_ATTEMPT_FAILED (a failure is "
    "remembered and a new key needed); retention not read: 24 h assumed (not a documented "
    "figure: check it before relying on same-key retries late in a day); a durable key store "
    "assumed for a hosted API (shopify.dev implementing-idempotency)",
)

IDEMPOTENCY_MIDDLEWARE = Contract(
    provider="idempotency-middleware",
    idempotency=Idempotency(
        kind="keyed",
        scope="caller",
        retention=24 * H,
        after_error="key_released",
        keys_durable=False,
        payload_checked=True,
        concurrent="conflict",
        conflict_wait=timedelta(seconds=15),
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="an HTTP idempotency middleware in front of an internal API (fastapi-idempotency "
    "0.1.1 defaults): 24 h window per caller; 5xx never stored, so the key is released; "
    "another body 422; a concurrent duplicate waits 15 s then 409; the default memory store "
    "survives no restart",
)

EXPRESS_IDEMPOTENCY = Contract(
    provider="express-idempotency",
    idempotency=Idempotency(
        kind="keyed",
        scope="the API process",
        retention=24 * H,
        after_error="key_released",
        keys_durable=False,
        payload_checked=True,
        concurrent="conflict",
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="express-idempotency 1.0.6 defaults (its source, npm): keys in process memory, "
    "never expired, all lost on a restart; only a 2xx answer is stored, any other deletes "
    "the key, also after the route committed; 409 while the first request runs; 417 for "
    "another URL, method, query or body; replays unmarked; no lookup (add one that reads "
    "your API's own records); the 24 h retention is a bound of ours",
)

IETF_IDEMPOTENCY_KEY = Contract(
    provider="ietf-idempotency-key",
    idempotency=Idempotency(
        kind="keyed",
        scope="resource",
        retention=24 * H,
        after_error="replayed",
        keys_durable=True,
        payload_checked=True,
        concurrent="conflict",
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="a middleware that follows draft-ietf-httpapi-idempotency-key-header (-06, -07) "
    "with a durable store: a retry after completion gets the first result, success or "
    "error; 409 while the first request runs; 422 for another payload; 400 without a key; "
    "no replay header; expiry left to the server's published policy (24 h assumed); the "
    "durable store is assumed (keys_durable=False for an in-memory one)",
)

PRESETS: dict[str, Contract] = {
    c.provider: c
    for c in (
        STRIPE_V1,
        STRIPE_V2,
        PAYPAL_ORDERS,
        ADYEN,
        RESEND,
        SENDGRID,
        SES,
        SMTP,
        ZENDESK,
        SHOPIFY,
        IDEMPOTENCY_MIDDLEWARE,
        EXPRESS_IDEMPOTENCY,
        IETF_IDEMPOTENCY_KEY,
    )
}
