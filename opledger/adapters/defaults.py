"""The default adapter registry: the bundled CRM, email and SMTP adapters, from settings.

Point `OPLEDGER_ADAPTERS` at your own 'module:function' to register your providers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from opledger.settings import Settings

from .crm import CrmAdapter, crm_contract
from .email import EmailAdapter, email_contract
from .registry import Registry
from .smtp import SmtpAdapter, smtp_contract
from .webhook import WebhookAdapter, webhook_contract


@dataclass(frozen=True)
class Timings:
    """The contract numbers the bundled adapters take from settings."""

    timeout: timedelta
    in_flight: timedelta | None
    retention: timedelta
    interval: timedelta
    lag: timedelta
    margin: timedelta

    @classmethod
    def of(cls, settings: Settings) -> Timings:
        retention = timedelta(seconds=settings.key_retention_seconds)
        return cls(
            timeout=timedelta(seconds=settings.provider_timeout_seconds),
            in_flight=timedelta(seconds=settings.provider_in_flight_seconds)
            if settings.provider_in_flight_seconds
            else None,
            retention=retention,
            interval=timedelta(seconds=settings.lookup_interval_seconds),
            lag=timedelta(seconds=settings.search_lag_seconds),
            margin=min(timedelta(minutes=5), retention / 10),
        )

    def keyed(self) -> dict[str, Any]:
        """Keyword arguments for `crm_contract` and `email_contract`."""
        return {
            "request_timeout": self.timeout,
            "max_in_flight": self.in_flight,
            "retention": self.retention,
            "lookup_interval": self.interval,
            "retention_margin": self.margin,
        }


def build_registry(settings: Settings) -> Registry:
    t = Timings.of(settings)
    adapters: list[Any] = [
        CrmAdapter(
            settings.crm_url,
            account=settings.crm_account,
            contract=crm_contract(**t.keyed()),
        ),
        EmailAdapter(
            settings.email_url,
            account=settings.email_account,
            contract=email_contract(**t.keyed(), search_lag=t.lag),
        ),
        SmtpAdapter(
            settings.smtp_host,
            settings.smtp_port,
            contract=smtp_contract(request_timeout=t.timeout, max_in_flight=t.in_flight),
        ),
    ]
    add_webhook(adapters, settings)
    return Registry(adapters)


def add_webhook(adapters: list[Any], settings: Settings) -> None:
    """Register the review-notification webhook when one is configured."""
    if settings.review_webhook_url:
        t = Timings.of(settings)
        adapters.append(
            WebhookAdapter(
                settings.review_webhook_url,
                contract=webhook_contract(
                    deduplicates=settings.review_webhook_deduplicates,
                    request_timeout=t.timeout,
                    max_in_flight=t.in_flight,
                ),
            )
        )
