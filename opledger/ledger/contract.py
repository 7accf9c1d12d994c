"""A provider's retry contract: what its documentation promises about keys and lookups.

Every adapter declares one. The retry decision reads nothing else about the provider, so a
contract must say honestly what is *not* promised (no keys, a search that lags, keys that
are pruned).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import model_validator

from .models import Record


class Idempotency(Record):
    """How the provider deduplicates requests that carry our key."""

    kind: Literal["none", "keyed"]
    #: what the key is unique within, e.g. "account", "account + API version", "region"
    scope: str = ""
    #: how long the provider remembers a key; after that a retry may create a new effect
    retention: timedelta | None = None
    #: a stored error response (a 500, a 400) is replayed for the same key
    errors_replayed: bool = False
    #: what a retry with a used key returns
    replay_returns: Literal["stored_response", "current_state", "rerun_failed"] = "stored_response"
    #: after a failed attempt the provider refuses the key and wants a new one
    failed_attempt_poisons_key: bool = False
    #: the provider answers a conflict (e.g. 409) while the first request is executing
    concurrent_conflict: bool = False
    max_key_length: int | None = None

    @model_validator(mode="after")
    def _keyed_needs_retention(self) -> Idempotency:
        if self.kind == "keyed" and (self.retention is None or self.retention <= timedelta(0)):
            raise ValueError("a keyed contract must state how long keys are kept")
        return self


class Lookup(Record):
    """How we can learn afterwards whether a request took effect."""

    kind: Literal["none", "status_api", "search"]
    #: status_api: answers authoritatively by our key, "no such request" included.
    #: search: eventually consistent; absence proves nothing; results may lag by `lag`.
    lag: timedelta = timedelta(0)
    #: how long to wait between two lookups while the answer is "still pending"
    interval: timedelta = timedelta(seconds=5)


class Contract(Record):
    """Everything the retry decision needs to know about one provider endpoint."""

    provider: str
    idempotency: Idempotency
    lookup: Lookup
    #: "applied": a success means the effect happened. "accepted": custody only (queued
    #: email), recorded as such and never reported as delivered.
    success_proves: Literal["applied", "accepted"] = "applied"
    #: our client's timeout for one request
    request_timeout: timedelta
    #: the longest a request may still be executing at the provider after we sent it;
    #: no second attempt starts before this has passed since the first one started
    max_in_flight: timedelta
    #: retries stop this long before the key's retention ends (clock skew, queueing)
    retention_margin: timedelta = timedelta(minutes=5)
    #: after this many attempts, a person decides
    max_attempts: int = 5
    #: where the numbers come from
    source: str = ""

    @model_validator(mode="after")
    def _in_flight_covers_timeout(self) -> Contract:
        if self.max_in_flight < self.request_timeout:
            raise ValueError("max_in_flight must be at least the request timeout")
        return self
