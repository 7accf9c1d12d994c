"""The registry the Stripe system tests' worker runs: the Stripe adapter alone, with the
stack's fast timings (`OPLEDGER_PROVIDER_TIMEOUT_SECONDS`, ...) and a retention and lag
from `OPLEDGER_KEY_RETENTION_SECONDS` and `OPLEDGER_SEARCH_LAG_SECONDS`, so a key expires
and a lookup is due within seconds (the production registry, `adapters.defaults`, keeps
Stripe's documented 24 h and one minute).

    OPLEDGER_ADAPTERS=tests.system.stripe_registry:build_registry
"""

from __future__ import annotations

from datetime import timedelta

from opledger.adapters.defaults import Timings
from opledger.adapters.registry import Registry
from opledger.adapters.stripe import StripeAdapter, stripe_contract
from opledger.settings import Settings


def build_registry(settings: Settings) -> Registry:
    key = settings.stripe_api_key
    if key is None:
        raise ValueError("the Stripe system tests set OPLEDGER_STRIPE_API_KEY")
    t = Timings.of(settings)
    contract = stripe_contract(
        request_timeout=t.timeout,
        max_in_flight=t.in_flight,
        lookup_interval=t.interval,
        retention=timedelta(seconds=settings.key_retention_seconds),
        retention_margin=timedelta(0),
        lookup_lag=t.lag,
    )
    return Registry([StripeAdapter(settings.stripe_url, api_key=key, contract=contract)])
