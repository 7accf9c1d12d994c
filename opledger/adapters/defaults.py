"""The default adapter registry: the bundled CRM, email and SMTP adapters, and Stripe when
a secret key is configured, from settings.

Point `OPLEDGER_ADAPTERS` at your own 'module:function' to register your providers.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from opledger.settings import Settings

from .crm import CrmAdapter, crm_contract
from .email import EmailAdapter, email_contract
from .imap import SentFolder
from .registry import Registry
from .smtp import SmtpAdapter, smtp_contract
from .stripe import StripeAdapter, stripe_contract
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
        smtp_adapter(settings, t),
    ]
    add_stripe(adapters, settings)
    add_webhook(adapters, settings)
    return Registry(adapters)


def smtp_adapter(settings: Settings, t: Timings) -> SmtpAdapter:
    """The SMTP adapter; with `OPLEDGER_SMTP_SENT_IMAP_HOST`, it looks an ambiguous send up
    in the mailbox's Sent folder (a search, with the declared lag)."""
    sent = SentFolder.of(settings, timeout=t.timeout.total_seconds())
    return SmtpAdapter(
        settings.smtp_host,
        settings.smtp_port,
        contract=smtp_contract(
            request_timeout=t.timeout,
            max_in_flight=t.in_flight,
            sent_search_lag=timedelta(seconds=settings.smtp_sent_search_lag_seconds)
            if sent is not None
            else None,
            lookup_interval=t.interval,
        ),
        sent=sent,
    )


def add_webhook(adapters: list[Any], settings: Settings) -> None:
    """Register the review-notification webhook when one is configured, signing with
    `OPLEDGER_REVIEW_WEBHOOK_SECRET` (and `..._PREVIOUS_SECRET` during a rotation)."""
    if settings.review_webhook_url:
        t = Timings.of(settings)
        secrets = [
            s
            for s in (settings.review_webhook_secret, settings.review_webhook_previous_secret)
            if s is not None
        ]
        adapters.append(
            WebhookAdapter(
                settings.review_webhook_url,
                contract=webhook_contract(
                    deduplicates=settings.review_webhook_deduplicates,
                    request_timeout=t.timeout,
                    max_in_flight=t.in_flight,
                ),
                secrets=secrets,
            )
        )


def add_stripe(adapters: list[Any], settings: Settings) -> None:
    """Register the Stripe adapter when a secret key is configured (OPLEDGER_STRIPE_API_KEY).

    Its contract is Stripe's documented one (`presets.STRIPE_V1`: keys kept 24 h, search
    about a minute behind); only our client's numbers (timeout, in-flight bound, lookup
    interval) come from the settings.
    """
    key = settings.stripe_api_key
    if key is None or not key.get_secret_value():
        return
    t = Timings.of(settings)
    adapters.append(
        StripeAdapter(
            settings.stripe_url,
            api_key=key,
            contract=stripe_contract(
                request_timeout=t.timeout,
                max_in_flight=t.in_flight,
                lookup_interval=t.interval,
            ),
        )
    )
