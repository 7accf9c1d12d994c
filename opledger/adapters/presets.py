"""Retry contracts of real providers, as their public documentation describes them.

Start an adapter for one of these from its preset, then check the endpoint and API
version you call: contracts differ between endpoints of one provider. Where a provider
does not document a number we choose the cautious reading and say so in `source`.
Timeouts and in-flight bounds are our client's choices, not the provider's.
"""

from __future__ import annotations

from datetime import timedelta

from opledger.ledger.contract import Contract, Idempotency, Lookup

H = timedelta(hours=1)
D = timedelta(days=1)
_timeout = timedelta(seconds=30)
_in_flight = timedelta(minutes=2)

STRIPE_V1 = Contract(
    provider="stripe.v1",
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=24 * H,
        errors_replayed=True,
        replay_returns="stored_response",
        concurrent_conflict=True,
        max_key_length=255,
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=1)),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Stripe API v1: keys per account, may be pruned after 24 h; first response "
    "(400/500 included) stored and replayed; 409 idempotency_key_in_use; no lookup by key, "
    "search normally < 1 min behind (docs.stripe.com idempotent_requests, error-low-level, search)",
)

STRIPE_V2 = Contract(
    provider="stripe.v2",
    idempotency=Idempotency(
        kind="keyed",
        scope="account + API + sandbox",
        retention=30 * D,
        errors_replayed=False,
        replay_returns="rerun_failed",
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=1)),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Stripe API v2: keys 30 days; failed work re-executed, success not repeated; lists "
    "eventually consistent (docs.stripe.com api-v2-overview)",
)

PAYPAL_ORDERS = Contract(
    provider="paypal.orders.v2",
    idempotency=Idempotency(
        kind="keyed",
        scope="PayPal-Request-Id per API",
        retention=6 * H,
        errors_replayed=False,
        replay_returns="current_state",
    ),
    lookup=Lookup(kind="search", lag=3 * H),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="PayPal Orders v2: PayPal-Request-Id kept 6 h (72 h on request); a retry returns the "
    "latest status; Transaction Search up to 3 h behind (developer.paypal.com idempotency)",
)

ADYEN = Contract(
    provider="adyen",
    idempotency=Idempotency(
        kind="keyed",
        scope="company account, per regional endpoint",
        retention=31 * D,
        errors_replayed=True,
        replay_returns="stored_response",
        max_key_length=64,
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Adyen: Idempotency-Key <= 64 chars, at least 31 days, first response returned, not "
    "checked across regions; webhooks for lost responses (docs.adyen.com api-idempotency)",
)

RESEND = Contract(
    provider="resend",
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=24 * H,
        errors_replayed=False,
        replay_returns="stored_response",
        concurrent_conflict=True,
        max_key_length=256,
    ),
    lookup=Lookup(kind="status_api"),
    success_proves="accepted",
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Resend POST /emails: Idempotency-Key 24 h; 409 invalid_idempotent_request vs "
    "concurrent_idempotent_requests; GET /emails/{id} once the id is known (resend.com docs)",
)

SENDGRID = Contract(
    provider="sendgrid",
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
    idempotency=Idempotency(
        kind="keyed",
        scope="account",
        retention=2 * H,
        errors_replayed=False,
        replay_returns="stored_response",
    ),
    lookup=Lookup(kind="search", lag=timedelta(minutes=5)),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Zendesk POST /api/v2/tickets: Idempotency-Key, x-idempotency-lookup hit/miss, "
    "mismatch 400 IdempotentRequestError, keys expire after 2 h (SDK); search lags minutes",
)

SHOPIFY = Contract(
    provider="shopify.admin",
    idempotency=Idempotency(
        kind="keyed",
        scope="shop",
        retention=24 * H,
        errors_replayed=False,
        replay_returns="stored_response",
        failed_attempt_poisons_key=True,
        concurrent_conflict=True,
    ),
    lookup=Lookup(kind="none"),
    request_timeout=_timeout,
    max_in_flight=_in_flight,
    source="Shopify Admin GraphQL @idempotent: IDEMPOTENCY_CONCURRENT_REQUEST, "
    "IDEMPOTENCY_KEY_PARAMETER_MISMATCH, IDEMPOTENCY_PREVIOUS_ATTEMPT_FAILED (new key needed); "
    "retention not read: 24 h assumed (shopify.dev implementing-idempotency)",
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
    )
}
