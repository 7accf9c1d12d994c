"""Settings, read from the environment with the prefix ``OPLEDGER_``."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

#: the broker Celery uses when `OPLEDGER_BROKER_URL` is unset
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"


class NotConfigured(RuntimeError):
    """A setting a production process needs is missing: it refuses to guess."""


class Settings(BaseSettings):
    """Everything configurable. Each field is the environment variable ``OPLEDGER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="OPLEDGER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="Postgres URL of the ledger. Unset: the local or an embedded Postgres "
        "(development and tests only).",
    )
    broker_url: str | None = Field(
        default=None, description="Redis URL of the Celery broker. Unset: an embedded Redis."
    )
    lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a claim holds an operation before the sweeper may fence it out.",
    )
    max_payload_bytes: int = Field(
        default=256 * 1024, gt=0, description="Largest canonical payload `prepare` accepts."
    )
    sweep_interval_seconds: float = Field(
        default=15.0, gt=0, description="How often beat runs the sweep."
    )
    relay_after_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A prepared operation unclaimed this long is enqueued again.",
    )
    payload_retention_days: float = Field(
        default=30.0,
        gt=0,
        description="Frozen payloads of finished operations are purged after this.",
    )
    review_after_attempts: int = Field(
        default=5, gt=0, description="Open a review when this many attempts left it unknown."
    )
    review_after_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="Open a review when unknown for this long."
    )

    check_backoff_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A check handed to reconcile is due again after this if nothing settles it "
        "(a lost message, a crashed reconciler).",
    )
    sweep_batch: int = Field(default=500, gt=0, description="Rows one sweep takes at most.")
    visibility_timeout_seconds: int = Field(
        default=3600,
        gt=0,
        description="Redis visibility timeout, set identically in every place Celery reads it; "
        "keep it well above the task time limit.",
    )
    task_time_limit_seconds: int = Field(
        default=300, gt=0, description="Hard time limit of one task."
    )
    worker_concurrency: int | None = Field(
        default=None, description="Worker processes; unset: one per core."
    )
    flower_user: str = Field(default="opledger", description="Flower basic-auth user.")
    flower_password: str | None = Field(
        default=None, description="Flower basic-auth password; Flower refuses to start without."
    )
    adapters: str = Field(
        default="opledger.adapters.defaults:build_registry",
        description="'module:function' returning the adapter Registry the workers use.",
    )
    crm_url: str = Field(default="http://127.0.0.1:8025", description="Base URL of the CRM API.")
    crm_account: str = Field(default="acme", description="CRM account the keys are scoped to.")
    email_url: str = Field(
        default="http://127.0.0.1:8025", description="Base URL of the email API."
    )
    email_account: str = Field(default="acme", description="Email API account.")
    smtp_host: str = Field(default="127.0.0.1", description="SMTP relay host.")
    smtp_port: int = Field(default=8026, description="SMTP relay port.")
    provider_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Request timeout of the bundled adapters."
    )
    provider_in_flight_seconds: float | None = Field(
        default=None,
        description="How long a request may still execute at the provider; unset: twice the "
        "timeout.",
    )
    key_retention_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="How long the CRM and email APIs keep keys."
    )
    search_lag_seconds: float = Field(
        default=30.0, ge=0, description="How far behind the email API's search may be."
    )
    review_webhook_url: str | None = Field(
        default=None,
        description="POSTed to (as an operation of its own) when a review opens; unset: no "
        "notifications.",
    )
    review_webhook_deduplicates: bool = Field(
        default=False,
        description="The webhook receiver deduplicates by Idempotency-Key, in a store that "
        "survives its restarts and keeps the first answer, errors included (allows same-key "
        "retries of a notification).",
    )
    lookup_interval_seconds: float = Field(
        default=5.0, gt=0, description="Time between two lookups of a still-pending request."
    )

    def require_database_url(self) -> str:
        """The ledger's URL; a runtime process never falls back to a database of its own."""
        if not self.database_url:
            raise NotConfigured(
                "OPLEDGER_DATABASE_URL is not set: a worker, beat or agent process needs the "
                "ledger's Postgres URL (development commands such as `opledger demo` find or "
                "start one themselves)"
            )
        return self.database_url

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings a process started with `environ` would read."""
        prefix = "OPLEDGER_"
        values = {
            key[len(prefix) :].lower(): value
            for key, value in environ.items()
            if key.startswith(prefix) and key[len(prefix) :].lower() in cls.model_fields
        }
        return cls.model_validate(values)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
