"""The default adapter registry: the bundled CRM, email and SMTP adapters, from settings.

Point `OPLEDGER_ADAPTERS` at your own 'module:function' to register your providers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from opledger.settings import Settings

from .crm import CrmAdapter, crm_contract
from .email import EmailAdapter, email_contract
from .registry import Registry
from .smtp import SmtpAdapter, smtp_contract
from .webhook import WebhookAdapter, webhook_contract


def build_registry(settings: Settings) -> Registry:
    timeout = timedelta(seconds=settings.provider_timeout_seconds)
    in_flight = (
        timedelta(seconds=settings.provider_in_flight_seconds)
        if settings.provider_in_flight_seconds
        else None
    )
    retention = timedelta(seconds=settings.key_retention_seconds)
    interval = timedelta(seconds=settings.lookup_interval_seconds)
    margin = min(timedelta(minutes=5), retention / 10)
    adapters: list[Any] = [
        CrmAdapter(
            settings.crm_url,
            account=settings.crm_account,
            contract=crm_contract(
                request_timeout=timeout,
                max_in_flight=in_flight,
                retention=retention,
                lookup_interval=interval,
                retention_margin=margin,
            ),
        ),
        EmailAdapter(
            settings.email_url,
            account=settings.email_account,
            contract=email_contract(
                request_timeout=timeout,
                max_in_flight=in_flight,
                retention=retention,
                lookup_interval=interval,
                retention_margin=margin,
                search_lag=timedelta(seconds=settings.search_lag_seconds),
            ),
        ),
        SmtpAdapter(
            settings.smtp_host,
            settings.smtp_port,
            contract=smtp_contract(request_timeout=timeout, max_in_flight=in_flight),
        ),
    ]
    add_webhook(adapters, settings)
    return Registry(adapters)


def add_webhook(adapters: list[Any], settings: Settings) -> None:
    """Register the review-notification webhook when one is configured."""
    if settings.review_webhook_url:
        adapters.append(
            WebhookAdapter(
                settings.review_webhook_url,
                contract=webhook_contract(
                    deduplicates=settings.review_webhook_deduplicates,
                    request_timeout=timedelta(seconds=settings.provider_timeout_seconds),
                    max_in_flight=timedelta(seconds=settings.provider_in_flight_seconds)
                    if settings.provider_in_flight_seconds
                    else None,
                ),
            )
        )
