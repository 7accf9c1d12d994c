"""The sandbox's state: each account's switches (`Config`), the armed faults, the keys,
the cases and messages, and the ground truth of what was applied; in memory, starting
empty (`reset` starts it again)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

FAULT_MODES = (
    "drop_after_commit",  # the effect is applied, then the connection is cut mid-response
    "delay_after_commit",  # the effect is applied, the response comes after `delay` seconds
    "error_before_commit",  # a 500 and no effect
    "error_after_commit",  # the effect is applied, then a 500
    "drop_after_data",  # SMTP: the message is accepted, the connection closes before the 250
    "refuse_after_data",  # SMTP: the body is refused for good (554), nothing accepted
    "defer_after_data",  # SMTP: the body is refused for now (451), nothing accepted
    "overloaded",  # CRM, email: a 503 with Retry-After `delay_s`, before anything is read
)
#: the faults that strike at the front door, before the limits, the key and the effect
FRONT_DOOR = ("overloaded",)
#: the providers whose writes pass the front door (faults there, per-account limits)
LIMITED_PROVIDERS = ("crm", "email")


@dataclass
class Config:
    """One account's behaviour. Each switch is a way real providers differ."""

    keys: bool = True  #: deduplicate by Idempotency-Key
    inflight_conflict: bool = True  #: 409 while a request with the same key executes
    inflight_wait_s: float = 0.0  #: hold such a concurrent request this long before the 409
    status_api: bool = True  #: CRM status endpoint by key, from the provider's own records
    #: store and replay error responses under the key; off, a 5xx releases the key (even
    #: when the change was applied before the failure), as many middlewares do
    replay_errors: bool = True
    payload_check: bool = True  #: refuse a used key with another payload; off, replay anyway
    keys_durable: bool = True  #: off, `/_admin/restart` forgets this account's keys
    error_codes: bool = True  #: error bodies carry a code; off, only a message
    echo_digest: bool = True  #: success bodies name our key and the body's digest
    max_key_length: int = 0  #: refuse longer keys with 400 (0: any length)
    retention_s: float = 24 * 3600.0  #: how long keys are remembered
    search_lag_s: float = 0.0  #: how long until an applied effect shows in search
    processing_s: float = 0.0  #: how long a request executes before it commits
    #: write requests executing at once; one more gets a 429 (0: unlimited)
    max_concurrent: int = 0
    #: write requests admitted per second, with `burst` at once after a quiet spell (a
    #: token bucket); one more gets a 429 (0: unlimited)
    rate_per_s: float = 0.0
    burst: int = 1


@dataclass
class Fault:
    provider: str
    mode: str
    times: int = 1
    delay_s: float = 0.0
    key: str | None = None  #: only requests with this key (None: any)


@dataclass
class Limiter:
    """One account's front door: a token bucket (`Config.rate_per_s`, `Config.burst`), the
    write requests in flight, and the ground truth of what it admitted and refused."""

    tokens: float | None = None  #: None: never used, so full
    refilled: float = 0.0
    in_flight: int = 0
    admitted: int = 0
    over_concurrency: int = 0
    over_rate: int = 0
    overloaded: int = 0
    max_in_flight: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None

    def admit(self, cfg: Config, now: float) -> float | None:
        """Admit one request (None: it is now in flight until `release`), or refuse it: the
        seconds until it could be admitted."""
        if cfg.max_concurrent > 0 and self.in_flight >= cfg.max_concurrent:
            self.over_concurrency += 1
            return 1.0
        if cfg.rate_per_s > 0:
            burst = max(1, cfg.burst)
            if self.tokens is None:
                self.tokens = float(burst)
            else:
                gained = (now - self.refilled) * cfg.rate_per_s
                self.tokens = min(float(burst), self.tokens + gained)
            self.refilled = now
            if self.tokens < 1:
                self.over_rate += 1
                return (1 - self.tokens) / cfg.rate_per_s
            self.tokens -= 1
        self.in_flight += 1
        self.admitted += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.first_admitted_at is None:
            self.first_admitted_at = now
        self.last_admitted_at = now
        return None

    def release(self) -> None:
        """The admitted request finished executing (its answer is about to be sent)."""
        self.in_flight -= 1

    def report(self) -> dict[str, Any]:
        return {
            "admitted": self.admitted,
            "over_limit": self.over_concurrency + self.over_rate,
            "over_concurrency": self.over_concurrency,
            "over_rate": self.over_rate,
            "overloaded": self.overloaded,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "first_admitted_at": self.first_admitted_at,
            "last_admitted_at": self.last_admitted_at,
        }


@dataclass
class KeyEntry:
    digest: str
    created: float
    state: str = "in_progress"
    status_code: int = 0
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    status: str = "open"
    version: int = 1
    fields: dict[str, Any] = field(default_factory=dict)
    closed_by: str | None = None
    last_key: str | None = None
    last_digest: str | None = None  #: digest of the body of the last change
    applied_at: float = 0.0


class State:
    def __init__(self) -> None:
        self.config = Config()  #: for accounts without a configuration of their own
        self.accounts: dict[str, Config] = {}
        self.faults: list[Fault] = []
        self.keys: dict[tuple[str, str, str], KeyEntry] = {}
        self.cases: dict[tuple[str, str], Case] = defaultdict(Case)
        self.messages: list[dict[str, Any]] = []
        self.effects: dict[str, int] = defaultdict(int)
        #: effects applied per business act, whatever key carried them: a CRM verb on a
        #: case ("crm:<account>:update:<case>"), an email to a recipient
        #: ("email:<account>:<to>") — two operations for one act show here as 2
        self.by_act: dict[str, int] = defaultdict(int)
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        #: the provider's own durable record of what each key applied: what its status
        #: API answers from, whatever the key store (a cache in front of it) says
        self.applied: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: each account's front door: one per account name, shared by its CRM and its email
        #: API as the account's `Config` is
        self.limiters: dict[str, Limiter] = defaultdict(Limiter)

    def take_fault(
        self, provider: str, key: str | None, *, front_door: bool = False
    ) -> Fault | None:
        """The next armed fault for this request: one of `FRONT_DOOR` at the front door,
        any other mode after it."""
        for fault in self.faults:
            if (
                fault.provider == provider
                and fault.times > 0
                and fault.key in (None, key)
                and (fault.mode in FRONT_DOOR) == front_door
            ):
                fault.times -= 1
                return fault
        return None

    def config_for(self, account: str) -> Config:
        return self.accounts.get(account, self.config)

    def key_entry(self, provider: str, account: str, key: str) -> KeyEntry | None:
        entry = self.keys.get((provider, account, key))
        if entry is not None and time.time() - entry.created > self.config_for(account).retention_s:
            del self.keys[(provider, account, key)]  # pruned: the key is new again
            return None
        return entry


_current = State()


def current() -> State:
    """The state a request arriving now works against (`reset` replaces it)."""
    return _current


def reset() -> None:
    """Forget everything: keys, cases, messages, faults, counters; the default config.
    A request still executing finishes against the state it arrived in."""
    global _current
    _current = State()
