"""Settings, read from the environment with the prefix ``OPLEDGER_``."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once."""
    return Settings()
