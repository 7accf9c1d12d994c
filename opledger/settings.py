"""Settings, read from the environment with the prefix ``OPLEDGER_``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Literal, TypedDict
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from opledger import variables
from opledger.ledger.approval_policy import policies_setting
from opledger.ledger.canonical import DEFAULT_MAX_PAYLOAD_BYTES, payload_limit
from opledger.ledger.contract import Limits
from opledger.ledger.errors import InvalidInput
from opledger.ledger.intents import parse_scopes
from opledger.ledger.payload_keys import KEYS_VARIABLE, PayloadKeysInvalid, parse_payload_keys
from opledger.ledger.pgschema import DEFAULT_SCHEMA, SCHEMA_VARIABLE, check_schema
from opledger.ledger.sensitive import RedactionRuleInvalid, parse_rules, rule_specs
from opledger.net import api_key_problem, folder_problem, imap_credential_problem, is_loopback
from opledger.signatures import secret_problem

#: the broker development mode uses when `OPLEDGER_BROKER_URL` is unset
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/0"
#: what Celery is given when no broker is configured outside development mode: publishing
#: is refused (`NotConfigured`) before anything connects, and the name never resolves
UNCONFIGURED_BROKER_URL = "redis://opledger-broker-not-configured.invalid:6379/0"


#: Celery brokers opledger is built and tested for
BROKER_SCHEMES = ("redis", "rediss", "sentinel", "amqp", "amqps", "pyamqp")


class LedgerOptions(TypedDict):
    """What a deployment's ledger is opened with, from its settings: the ledger reads no
    environment of its own but the schema (`Ledger.from_url(url, **options)`)."""

    max_payload_bytes: int
    schema: str
    payload_keys: SecretStr | None


class NotConfigured(RuntimeError):
    """A setting a production process needs is missing: it refuses to guess."""


class SettingsInvalid(NotConfigured):
    """A setting has a value opledger cannot use; the message names the variable."""

    @classmethod
    def from_error(cls, exc: ValidationError) -> SettingsInvalid:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = "OPLEDGER_" + field.upper() if field else "a setting"
        value = _shown(field, first.get("input"))
        shown = f" (got {value!r})" if value is not None else ""
        more = f"; and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
        message = str(first["msg"]).removeprefix("Value error, ")
        return cls(f"{name}: {message}{shown}{more}")


def _shown(field: str, value: object) -> object:
    """What an error may quote of a refused value: nothing of a secret, and a URL without
    its password."""
    known = Settings.model_fields.get(field)
    if known is not None and "SecretStr" in str(known.annotation):
        return None
    if not isinstance(value, str | int | float):
        return None
    if isinstance(value, str) and "@" in value:
        try:
            password = urlsplit(value).password
        except ValueError:
            return None  # not a URL we can take apart: it may hold anything
        if password:
            return value.replace(f":{password}@", ":***@")
    return value


class ProviderLimits(BaseModel):
    """A provider's limits from `OPLEDGER_PROVIDER_LIMITS` (see `Limits`): each key given
    replaces the contract's value, each key left out keeps it."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = Field(default=None, gt=0)
    rate: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, gt=0)
    breaker_after: int | None = Field(default=None, gt=0)
    probe_every_seconds: float | None = Field(default=None, gt=0)
    probe_max_seconds: float | None = Field(default=None, gt=0)
    retry_after_default_seconds: float | None = Field(default=None, ge=0)
    retry_after_max_seconds: float | None = Field(default=None, ge=0)

    def apply(self, limits: Limits) -> Limits:
        """`limits` with what this setting gives (what it leaves out keeps its value)."""
        given = self.model_dump(exclude_none=True)
        update: dict[str, object] = {
            key.removesuffix("_seconds"): timedelta(seconds=value)
            if key.endswith("_seconds")
            else value
            for key, value in given.items()
        }
        return Limits.model_validate(limits.model_dump() | update)


class Settings(BaseSettings):
    """Everything configurable. Each field is the environment variable ``OPLEDGER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="OPLEDGER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="Postgres URL of the ledger (postgresql://...). Required, except in "
        "development mode.",
    )
    database_schema: str = Field(
        default=DEFAULT_SCHEMA,
        description="Postgres schema the ledger's tables, functions and type live in. Every "
        "process (workers, beat, console, CLI, agents) must name the same one.",
    )
    broker_url: str | None = Field(
        default=None,
        description="URL of the Celery broker (redis:// or amqp://). Required by worker, "
        "beat and flower, except in development mode.",
    )
    dev: bool = Field(
        default=False,
        description="Development mode: with no database or broker configured, the commands "
        "use the local Postgres and Redis, or start embedded ones (never in production).",
    )
    lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long a claim holds an operation before the sweeper may fence it out.",
    )
    max_payload_bytes: int = Field(
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        description="Largest canonical payload `prepare` accepts, in bytes.",
    )
    sweep_interval_seconds: float = Field(
        default=15.0, gt=0, description="How often beat runs the sweep."
    )
    relay_after_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A prepared operation unclaimed this long is enqueued again.",
    )
    beat_missing_after_seconds: float = Field(
        default=60.0,
        gt=0,
        description="No beat heartbeat for this long counts as no beat: `opledger check` "
        "fails, workers log it, agents waiting on the relay are told; keep it several "
        "sweep intervals.",
    )
    payload_retention_days: float = Field(
        default=30.0,
        gt=0,
        description="Frozen payloads of finished operations are purged after this.",
    )
    payload_keys: SecretStr | None = Field(
        default=None,
        description="Keys frozen payloads are encrypted with: `key_id:base64(32 bytes)`, "
        "comma-separated, the first encrypting, all decrypting; unset: stored in clear. "
        "Never logged or shown.",
    )
    review_after_attempts: int = Field(
        default=5, gt=0, description="Open a review when this many attempts left it unknown."
    )
    review_after_seconds: float = Field(
        default=24 * 3600.0, gt=0, description="Open a review when unknown for this long."
    )

    provider_wait_seconds: float = Field(
        default=2.0,
        ge=0,
        description="How long a worker waits in a task for a provider's capacity (its "
        "declared concurrency and rate, a short Retry-After) before it leaves the operation "
        "for later and takes the next task.",
    )
    provider_limits: dict[str, ProviderLimits] = Field(
        default_factory=dict,
        description="A deployment's limits for its providers, as JSON by provider name: "
        '{"crm": {"concurrency": 4, "rate": 20, "burst": 5}}; they replace what the '
        "adapters' contracts declare (every process must give the same).",
    )

    intent_scopes: str | None = Field(
        default=None,
        description="A deployment's intent scope per action, over what its adapter declares: "
        "action=run|tenant pairs separated by ',' (e.g. 'stripe.payment_intent.v1=tenant'). "
        "'tenant': one act whatever run or agent of the tenant asks; 'run': one act per run. "
        "Every process must give the same.",
    )

    approval_policies: str | None = Field(
        default=None,
        description="A deployment's approval policy per action, over what its adapter "
        "declares: inline JSON (starting with '{') or the path of a JSON file, e.g. "
        '{"stripe.refund.v1": {"when": [{"field": "amount", "above": 10000}], '
        '"approvers": 2}}; "always", "never" or rules (docs/approvals.md). Every process '
        "that records acts must give the same.",
    )

    switch_suspect_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="After a ledger switch (a failover to a standby, a restore), operations "
        "prepared for this long are never first-dispatched blind: each is looked up by its "
        "key, sent again under the key the provider deduplicates, or held for a person, "
        "since it may be an act asked again whose first record the switch lost.",
    )
    require_sync_standby: bool = Field(
        default=False,
        description="Strict mode: workers claim nothing while the ledger's commits do not "
        "wait for an attached synchronous standby (a failover could then lose claims and "
        "outcomes); `opledger check` reports it as a warning.",
    )
    inline_dispatch: str = Field(
        default="off",
        pattern=r"^\s*(off|on|never|[A-Za-z0-9_.*?\[\]-]+(\s*,\s*[A-Za-z0-9_.*?\[\]-]+)*)?\s*$",
        description="Which acts an agent's `Effects` claims and sends in its own process "
        "instead of through a worker: `off` or empty (only calls that ask, `inline=True`), `on` "
        "(every action), action patterns separated by commas (`crm.*,email.*`), or `never` "
        "(this process sends nothing itself, even when a call asks).",
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
    broker_consumer_timeout_seconds: float = Field(
        default=1800.0,
        gt=0,
        description="RabbitMQ's consumer_timeout as configured on the server (RabbitMQ's "
        "default: 30 min); must exceed the task time limit.",
    )
    rabbitmq_queue_type: Literal["classic", "quorum"] = Field(
        default="classic",
        description="On RabbitMQ, the type of opledger's queues: classic, or quorum "
        "(replicated; their exchanges are then topic exchanges, for Celery's native "
        "delayed delivery). Ignored on Redis.",
    )
    task_time_limit_seconds: int = Field(
        default=300, gt=0, description="Hard time limit of one task."
    )
    worker_concurrency: int | None = Field(
        default=None, description="Worker processes; unset: one per core."
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines: human-readable text, or one JSON object per line with op_id, "
        "tenant, action, fence, attempt, decision and task_id where they apply.",
    )
    flower_user: str = Field(default="opledger", description="Flower basic-auth user.")
    flower_password: str | None = Field(
        default=None, description="Flower basic-auth password; Flower refuses to start without."
    )
    adapters: str = Field(
        default="opledger.adapters.defaults:build_registry",
        description="'module:function' returning the adapter Registry; every process "
        "(workers, beat, console, CLI, agents) must name the same one and import it.",
    )
    crm_url: str = Field(default="http://127.0.0.1:8025", description="Base URL of the CRM API.")
    crm_account: str = Field(default="acme", description="CRM account the keys are scoped to.")
    email_url: str = Field(
        default="http://127.0.0.1:8025", description="Base URL of the email API."
    )
    email_account: str = Field(default="acme", description="Email API account.")
    smtp_host: str = Field(default="127.0.0.1", description="SMTP relay host.")
    smtp_port: int = Field(default=8026, description="SMTP relay port.")
    smtp_sent_imap_host: str | None = Field(
        default=None,
        description="IMAP host of the mailbox the SMTP adapter sends as, whose provider files "
        "a copy of each submitted message in a Sent folder; set, an ambiguous SMTP send is "
        "looked up there by its Message-ID. Unset: SMTP has no lookup.",
    )
    smtp_sent_imap_port: int | None = Field(
        default=None, description="IMAP port; unset: 993 for imaps, 143 otherwise."
    )
    smtp_sent_imap_tls: Literal["imaps", "starttls", "none"] = Field(
        default="imaps",
        description="IMAP connection security: imaps (implicit TLS), starttls, or none "
        "(loopback hosts only).",
    )
    smtp_sent_imap_user: str | None = Field(
        default=None, description="IMAP login of the Sent folder's mailbox."
    )
    smtp_sent_imap_password: SecretStr | None = Field(
        default=None, description="IMAP password (an app password); never logged or shown."
    )
    smtp_sent_imap_cafile: str | None = Field(
        default=None,
        description="CA bundle the IMAP server's certificate is verified with; unset: the "
        "system's.",
    )
    smtp_sent_folder: str = Field(
        default="Sent",
        description='The Sent folder\'s name as the IMAP server lists it (e.g. "Sent Items", '
        '"[Gmail]/Sent Mail").',
    )
    smtp_sent_search_lag_seconds: float = Field(
        default=60.0,
        ge=0,
        description="How long after a send's in-flight deadline its Sent copy may still be "
        "missing; not found after this, a person decides.",
    )
    stripe_url: str = Field(
        default="https://api.stripe.com",
        description="Base URL of the Stripe API (v1) the Stripe adapter calls.",
    )
    stripe_api_key: SecretStr | None = Field(
        default=None,
        description="Stripe secret key (sk_test_... or sk_live_...); the Stripe adapter is "
        "registered only when it is set. Never logged or shown.",
    )
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
    mcp_clients: str | None = Field(
        default=None,
        description="The MCP gateway's clients file (JSON): each agent's token sha256, "
        "tenant, grant and run mode (`opledger mcp token` adds one).",
    )
    mcp_upstream: str | None = Field(
        default=None,
        description="`opledger mcp proxy`'s upstream file (JSON): the MCP server behind it, "
        "its tools with effects and those passed through.",
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
    review_webhook_secret: SecretStr | None = Field(
        default=None,
        description="Signs every review webhook (Opledger-Signature, docs/webhooks.md); at "
        "least 32 printable ASCII characters. Unset: sent unsigned. Never logged or shown.",
    )
    review_webhook_previous_secret: SecretStr | None = Field(
        default=None,
        description="During a rotation, the secret being replaced: requests carry a "
        "signature with each until it is unset. Never logged or shown.",
    )
    lookup_interval_seconds: float = Field(
        default=5.0, gt=0, description="Time between two lookups of a still-pending request."
    )
    console_signin_key: SecretStr | None = Field(
        default=None,
        description="The key every review console process signs its sign-in forms with, so "
        "several behind one host name accept each other's forms (unset: a random key per "
        "process). At least 32 printable characters. Never logged or shown.",
    )
    redact: str | None = Field(
        default=None,
        description="More fields hidden per action wherever the CLI shows a payload, a "
        "provider's response, evidence or a result: ACTION=path,path rules separated by ';' "
        "(e.g. 'crm.*=note,customer.email;stripe.*=metadata').",
    )

    @field_validator("provider_limits", mode="before")
    @classmethod
    def _provider_limits(cls, raw: object) -> object:
        if isinstance(raw, str):
            try:
                return json.loads(raw) if raw.strip() else {}
            except ValueError as exc:
                raise ValueError(
                    'not JSON: the form is {"crm": {"concurrency": 4, "rate": 20, "burst": 5}}'
                ) from exc
        return raw

    @field_validator("intent_scopes")
    @classmethod
    def _intent_scopes(cls, raw: str | None) -> str | None:
        if raw is not None:
            try:
                parse_scopes(raw)  # the ledger's own parser: one rule for both
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None
        return raw

    @field_validator("approval_policies")
    @classmethod
    def _approval_policies(cls, raw: str | None) -> str | None:
        if raw is not None:
            try:
                policies_setting(raw)  # the ledger's own reader: one rule for both
            except InvalidInput as exc:
                raise ValueError(str(exc)) from None
        return raw

    @field_validator("max_payload_bytes", mode="before")
    @classmethod
    def _payload_limit(cls, raw: object) -> int:
        return payload_limit(raw)  # the ledger's own parser: one rule for both

    @field_validator("redact")
    @classmethod
    def _redact(cls, rules: str | None) -> str | None:
        try:
            parse_rules(rule_specs(rules))  # the rules' own parser: one message for both
        except RedactionRuleInvalid as exc:
            raise ValueError(str(exc)) from None
        return rules

    @field_validator("payload_keys")
    @classmethod
    def _payload_keys(cls, keys: SecretStr | None) -> SecretStr | None:
        if keys is None or not keys.get_secret_value().strip():
            return None
        try:
            parse_payload_keys(keys.get_secret_value())  # the ledger's own parser
        except PayloadKeysInvalid as exc:  # said without its variable name (it is added)
            raise ValueError(str(exc).removeprefix(f"{KEYS_VARIABLE} ")) from None
        return keys

    @field_validator("database_schema", mode="before")
    @classmethod
    def _schema(cls, raw: object) -> str:
        if isinstance(raw, str) and not raw.strip():
            return DEFAULT_SCHEMA
        try:
            return check_schema(raw.strip() if isinstance(raw, str) else raw)
        except InvalidInput as exc:  # the ledger's own rule, said without its variable name
            raise ValueError(str(exc).removeprefix(f"{SCHEMA_VARIABLE} ")) from None

    @field_validator("database_url")
    @classmethod
    def _postgres(cls, url: str | None) -> str | None:
        if url is None or not url.strip():
            return None
        scheme = urlsplit(url).scheme.split("+")[0]
        if scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"must be a postgresql:// URL, not {scheme + '://' if scheme else 'this'}"
            )
        return url

    @field_validator("broker_url")
    @classmethod
    def _broker(cls, url: str | None) -> str | None:
        if url is None or not url.strip():
            return None
        scheme = urlsplit(url).scheme
        if scheme not in BROKER_SCHEMES:
            raise ValueError(
                f"must be a Redis or RabbitMQ URL ({', '.join(s + '://' for s in BROKER_SCHEMES)}),"
                f" not {scheme + '://' if scheme else 'this'}"
            )
        return url

    @field_validator("stripe_api_key")
    @classmethod
    def _stripe_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is None or not key.get_secret_value():
            return None
        problem = api_key_problem(key.get_secret_value())
        if problem is not None:
            raise ValueError(f"not a Stripe secret key: {problem}")
        return key

    @field_validator("console_signin_key")
    @classmethod
    def _signin_key(cls, key: SecretStr | None) -> SecretStr | None:
        if key is None or not key.get_secret_value():
            return None
        problem = secret_problem(key.get_secret_value())
        if problem is not None:
            raise ValueError(f"not a usable signing key: {problem}")
        return key

    @field_validator("review_webhook_secret", "review_webhook_previous_secret")
    @classmethod
    def _signing_secret(cls, secret: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if secret is None or not secret.get_secret_value():
            return None
        problem = secret_problem(secret.get_secret_value())
        if problem is not None:
            raise ValueError(f"not a usable signing secret: {problem}")
        if info.field_name == "review_webhook_previous_secret" and not info.data.get(
            "review_webhook_secret"
        ):
            raise ValueError(
                "set only beside OPLEDGER_REVIEW_WEBHOOK_SECRET (the new secret, which signs too)"
            )
        return secret

    @model_validator(mode="after")
    def _sent_folder(self) -> Settings:
        """The SMTP adapter's Sent-folder search: all of it, or nothing."""

        host = (self.smtp_sent_imap_host or "").strip()
        if not host:
            self.smtp_sent_imap_host = None
            return self
        password = self.smtp_sent_imap_password
        missing = [
            f"OPLEDGER_SMTP_SENT_IMAP_{name.upper()}"
            for name, given in (
                ("user", bool(self.smtp_sent_imap_user)),
                ("password", password is not None and bool(password.get_secret_value())),
            )
            if not given
        ]
        if missing:
            raise ValueError(
                f"OPLEDGER_SMTP_SENT_IMAP_HOST is set, so {' and '.join(missing)} must be too"
            )
        if self.smtp_sent_imap_tls == "none" and not is_loopback(host):
            raise ValueError(
                f"OPLEDGER_SMTP_SENT_IMAP_TLS=none sends the IMAP password in the clear: only "
                f"to a loopback host, not {host!r} (use imaps or starttls)"
            )
        why = folder_problem(self.smtp_sent_folder)
        if why is not None:
            raise ValueError(f"OPLEDGER_SMTP_SENT_FOLDER: {why}")
        assert password is not None  # checked above
        for name, value in (
            ("USER", self.smtp_sent_imap_user),
            ("PASSWORD", password.get_secret_value()),
        ):
            problem = imap_credential_problem(value or "")
            if problem is not None:
                raise ValueError(
                    f"OPLEDGER_SMTP_SENT_IMAP_{name} cannot be sent to IMAP: {problem}"
                )
        return self

    def ledger_options(self) -> LedgerOptions:
        """The payload limit, the schema and the payload keys every process of this
        deployment opens its ledger with: `Ledger.from_url(url, **settings.ledger_options())`."""
        return LedgerOptions(
            max_payload_bytes=self.max_payload_bytes,
            schema=self.database_schema,
            payload_keys=self.payload_keys,
        )

    def require_database_url(self) -> str:
        """The ledger's URL; a runtime process never falls back to a database of its own."""
        if not self.database_url:
            raise NotConfigured(
                "OPLEDGER_DATABASE_URL is not set: set it to the ledger's postgresql:// URL "
                "(or OPLEDGER_DEV=1 on a development machine)"
                + variables.typo_hint("DATABASE_URL", setting_names(), os.environ)
            )
        return self.database_url

    def require_broker_url(self) -> str:
        """The broker's URL; a production process never falls back to a local Redis."""
        if not self.broker_url:
            raise NotConfigured(
                "OPLEDGER_BROKER_URL is not set: set it to the Celery broker's redis:// or "
                "amqp:// URL (or OPLEDGER_DEV=1 on a development machine)"
                + variables.typo_hint("BROKER_URL", setting_names(), os.environ)
            )
        return self.broker_url

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        """The settings a process started with `environ` would read."""
        prefix = "OPLEDGER_"
        values = {
            key[len(prefix) :].lower(): value
            for key, value in environ.items()
            if key.startswith(prefix) and key[len(prefix) :].lower() in cls.model_fields
        }
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise SettingsInvalid.from_error(exc) from None


def setting_names() -> frozenset[str]:
    """Every setting's name, upper-case and without its prefix (DATABASE_URL, ...)."""
    return frozenset(name.upper() for name in Settings.model_fields)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """`OPLEDGER_` variables that are no setting (likely typos), each with a suggestion
    (`opledger.variables`)."""
    return variables.unknown(environ, setting_names())


def suggestion(variable: str) -> str | None:
    """The setting an unknown `OPLEDGER_` variable most likely means, or None."""
    return variables.suggestion(variable, setting_names())


def state_dir() -> Path:
    """Where a process keeps local state (beat's schedule file; in development, the
    embedded services): `OPLEDGER_STATE_DIR`, else `.opledger` in the working directory."""
    return Path(os.environ.get("OPLEDGER_STATE_DIR", ".opledger"))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once; an unusable value is `SettingsInvalid`."""
    try:
        return Settings()
    except ValidationError as exc:
        raise SettingsInvalid.from_error(exc) from None
