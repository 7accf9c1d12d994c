"""One CRM per provider-contract kind, side by side, plus the email API and SMTP.

The sandbox serves each kind from its own account, configured so that nothing but the
contract protects against duplicates: no provider here answers a concurrent request with
a conflict, so if opledger ever sent a second request while the first was in flight, the
ground truth would show it.

    OPLEDGER_ADAPTERS=opledger.dev.chaos.variants:build_registry
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.defaults import Timings, add_webhook
from opledger.adapters.email import EmailAdapter, email_contract
from opledger.adapters.registry import Registry
from opledger.adapters.smtp import SmtpAdapter, smtp_contract
from opledger.ledger.contract import Contract, Limits
from opledger.settings import Settings


@dataclass(frozen=True)
class Kind:
    name: str
    namespace: str
    account: str
    keys: bool
    lookup: Literal["status_api", "search", "none"]
    #: the limits this account's contract declares (concurrency, rate, burst)
    limits: Limits | None = None
    #: the limits the sandbox enforces on it with a 429 and Retry-After (default: those
    #: declared); stricter than declared, the provider says "not now" and is waited out
    enforced: Limits | None = None

    @property
    def provider(self) -> str:
        return f"crm:{self.account}"

    @property
    def action(self) -> str:
        return f"{self.namespace}.close_case.v1"

    def sandbox_config(self, settings: Settings) -> dict[str, Any]:
        config: dict[str, Any] = {
            "keys": self.keys,
            "inflight_conflict": False,
            "status_api": self.lookup == "status_api",
            "retention_s": settings.key_retention_seconds,
            "search_lag_s": settings.search_lag_seconds if self.lookup == "search" else 0.0,
        }
        limits = self.enforced or self.declared(settings)
        if limits.limited:
            config.update(provider_limits(limits))
        return config

    def declared(self, settings: Settings) -> Limits:
        """The limits enforced for this kind: its contract's, or those
        `OPLEDGER_PROVIDER_LIMITS` gives its provider, as a deployment would."""
        limits = self.limits or crm_contract(provider=self.provider).limits
        given = settings.provider_limits.get(self.provider)
        return given.apply(limits) if given is not None else limits


KINDS = (
    Kind("keyed+status", "crm", "keyed-status", keys=True, lookup="status_api"),
    Kind("keyed", "crmk", "keyed-nolookup", keys=True, lookup="none"),
    Kind("search", "crms", "search-only", keys=False, lookup="search"),
    Kind("no-dedup", "crmn", "no-dedup", keys=False, lookup="none"),
    # keyed with a status API, behind a rate limiter that answers 429 with Retry-After
    Kind(
        "rate-limited",
        "crml",
        "rate-limited",
        keys=True,
        lookup="status_api",
        limits=Limits(concurrency=2, rate=20, burst=2, throttle_applies_nothing=True),
        # the account's plan is smaller than the contract says: 429s, waited out
        enforced=Limits(concurrency=2, rate=2, burst=1),
    ),
)
#: a provider without deduplication whose status API answers authoritatively by our key:
#: "absent" after the in-flight deadline allows a retry. Registered beside KINDS (the
#: frozen-sender system tests use it) but not driven by the crash-window tests or chaos.
NO_DEDUP_STATUS = Kind(
    "no-dedup+status", "crmx", "no-dedup-status", keys=False, lookup="status_api"
)
ALL_KINDS = (*KINDS, NO_DEDUP_STATUS)
EMAIL_ACCOUNT = "mail"


def provider_limits(limits: Limits) -> dict[str, Any]:
    """The sandbox settings that enforce `limits`, with room for the network's jitter in
    the burst (calls admitted a few ms apart here may arrive closer together there)."""
    return {
        "max_concurrent": limits.concurrency or 0,
        "rate_per_s": limits.rate or 0.0,
        "burst": limits.burst + 2,
    }


def build_registry(settings: Settings) -> Registry:
    t = Timings.of(settings)
    adapters: list[Any] = [
        CrmAdapter(
            settings.crm_url,
            account=kind.account,
            namespace=kind.namespace,
            contract=crm_contract(
                **t.keyed(),
                keys=kind.keys,
                lookup=kind.lookup,
                search_lag=t.lag,
                provider=kind.provider,
                concurrent="unchecked",  # the sandbox answers no concurrent request with 409
                limits=kind.limits,
            ),
        )
        for kind in ALL_KINDS
    ]
    adapters.append(
        EmailAdapter(
            settings.email_url,
            account=EMAIL_ACCOUNT,
            contract=_unchecked(email_contract(**t.keyed(), search_lag=t.lag)),
        )
    )
    adapters.append(
        SmtpAdapter(
            settings.smtp_host,
            settings.smtp_port,
            contract=smtp_contract(request_timeout=t.timeout, max_in_flight=t.in_flight),
        )
    )
    add_webhook(adapters, settings)
    return Registry(adapters)


def _unchecked(contract: Contract) -> Contract:
    """The contract with concurrent requests unchecked, as the sandbox is configured here."""
    idem = contract.idempotency.model_copy(update={"concurrent": "unchecked"})
    return contract.model_copy(update={"idempotency": idem})


def configure_sandbox(sandbox: Any, settings: Settings) -> None:
    """Give each kind's account its protections (and nothing more) in the sandbox."""
    for kind in ALL_KINDS:
        sandbox.configure(account=kind.account, **kind.sandbox_config(settings))
    sandbox.configure(
        account=EMAIL_ACCOUNT,
        keys=True,
        inflight_conflict=False,
        retention_s=settings.key_retention_seconds,
        search_lag_s=settings.search_lag_seconds,
    )
