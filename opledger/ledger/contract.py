"""A provider's retry contract: what its documentation promises about keys and lookups.

Every adapter declares one. The retry decision reads nothing else about the provider, so a
contract must say honestly what is *not* promised (no keys, a search that lags, keys that
are pruned, keys released after an error). Every field below changes some decision
(`opledger.ledger.decide`) or what a reviewer is told (`opledger.ledger.consequences`);
where a provider does not document a fact, the default is the cautious reading.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from .models import Record

#: What the provider does with a key when a request fails *at the provider* (a 5xx, a crash,
#: a timeout on its side):
#: - "replayed": the failure is stored under the key and every retry gets it back (Stripe v1):
#:   a same-key retry after such an error learns nothing;
#: - "nothing_applied": recording the key and applying the change are one commit at the
#:   provider, so a failure leaves nothing applied and the key free: a same-key retry is safe;
#: - "rerun_failed": a retry with the key returns the first request's current outcome and
#:   re-runs only the work that failed (Stripe v2 re-executes failed or partly failed work,
#:   PayPal returns the latest status): a same-key retry is safe;
#: - "key_released": the key is dropped on an error although the change may already have been
#:   applied (idempotency middlewares that never store a 5xx): a same-key retry after any
#:   outcome we could not read may apply the change again. The cautious default.
AfterError = Literal["replayed", "nothing_applied", "rerun_failed", "key_released"]

#: What a request gets while another one with the same key is still executing:
#: - "conflict": a refusal at once (HTTP 409 "in progress"), or after `conflict_wait`;
#: - "unchecked": nothing stops it; both may execute. The cautious default.
Concurrent = Literal["conflict", "unchecked"]

#: What the provider's response ties to our request:
#: - "key_and_digest": our key and a digest of the request body it executed;
#: - "key": our key (or a receipt derived from it), but not the body;
#: - "nothing": neither. The cautious default.
ResponseBinds = Literal["nothing", "key", "key_and_digest"]


class Idempotency(Record):
    """How the provider deduplicates requests that carry our key."""

    kind: Literal["none", "keyed"]
    #: where a key is unique, concretely: e.g. "account acme", "account acme, region eu".
    #: Every attempt records the scope it was sent into; a same-key retry into another
    #: scope is not deduplicated against the earlier attempts.
    scope: str = ""
    #: how long the provider remembers a key; after that a retry may create a new effect
    retention: timedelta | None = None
    #: what a failure at the provider does to the key (see `AfterError`)
    after_error: AfterError = "key_released"
    #: the key store survives a provider restart; when not, a key may be forgotten at any
    #: time and a same-key retry proves nothing until a lookup says what happened
    keys_durable: bool = False
    #: a used key with another payload is refused (with a code the adapter maps to
    #: `idempotency_mismatch`); when not checked, a replayed response under our key may be
    #: the answer to someone else's request
    payload_checked: bool = False
    #: what a concurrent request with the same key gets (see `Concurrent`)
    concurrent: Concurrent = "unchecked"
    #: with "conflict": how long the provider holds the second request before refusing it
    conflict_wait: timedelta = timedelta(0)
    #: after a failed attempt the provider refuses the key and wants a new one (Shopify)
    failed_attempt_poisons_key: bool = False
    #: the longest key the provider accepts; a longer key is never sent
    max_key_length: int | None = None
    #: every answer the provider replays from what it stored under a key says so (Stripe's
    #: `Idempotent-Replayed: true`), and the adapter records it (`replayed` in the outcome's
    #: detail). Then a success that is *not* marked, on a same-key resend after an attempt
    #: that may have applied, is a fresh execution: the provider did not know the key any
    #: more, and may have applied the effect twice. The operation is confirmed and a person
    #: is asked to check for a duplicate (`evidence.possible_duplicate`). Not marked (the
    #: default): a fresh success and a replay look alike, and nothing can be told from it.
    marks_replays: bool = False

    @model_validator(mode="after")
    def _keyed_needs_retention(self) -> Idempotency:
        if self.kind == "keyed" and (self.retention is None or self.retention <= timedelta(0)):
            raise ValueError("a keyed contract must state how long keys are kept")
        if self.max_key_length is not None and self.max_key_length < 1:
            raise ValueError("max_key_length must be positive")
        if self.marks_replays and self.kind != "keyed":
            raise ValueError(
                "marks_replays needs a keyed contract: nothing is replayed without keys"
            )
        return self


class Lookup(Record):
    """How we can learn afterwards whether a request took effect."""

    kind: Literal["none", "status_api", "search"]
    #: status_api: answers authoritatively by our key, "no such request" included, from the
    #: provider's own durable records (not from a key cache that a restart may wipe).
    #: search: eventually consistent; absence proves nothing; results may lag by `lag`.
    lag: timedelta = timedelta(0)
    #: search: the lookup reads something read-after-write first (Stripe's lists), so a hit
    #: right after the in-flight deadline confirms, before the search could have caught up;
    #: absence still proves nothing until `lag` has passed
    read_after_write: bool = False
    #: how long to wait between two lookups while the answer is "still pending"
    interval: timedelta = timedelta(seconds=5)


class Limits(Record):
    """How hard the whole fleet may press on the provider, and what its "not now" means.

    The limits are enforced by the ledger before a claim is taken (`Claims.claim`), for
    every worker at once: an operation waiting for capacity takes no claim, no fence and no
    attempt. Declare them at or below what the provider allows your account (its documented
    rate limit), leaving it the room it needs for requests you send from elsewhere.
    """

    #: calls in flight at once across the fleet (None: no limit). A call whose answer was
    #: lost (a timeout) keeps its place until its in-flight deadline: it may still run there
    concurrency: int | None = Field(default=None, gt=0)
    #: calls started per second across the fleet (None: no limit)
    rate: float | None = Field(default=None, gt=0)
    #: calls that may start at once after a quiet spell, within `rate` (a token bucket)
    burst: int = Field(default=1, gt=0)
    #: the provider documents that a "not now" answer (HTTP 429, a 503 with Retry-After, or
    #: one of the adapter's overload codes) executed nothing: such an attempt is recorded as
    #: not applied. When not documented it is an attempt that may have applied, whose
    #: answer still says how long to wait; either way it never counts toward `max_attempts`
    throttle_applies_nothing: bool = False
    #: how long to wait after a "not now" that names no time (no Retry-After)
    retry_after_default: timedelta = timedelta(seconds=1)
    #: the longest wait a provider's Retry-After is taken at its word for
    retry_after_max: timedelta = timedelta(minutes=10)
    #: consecutive refusals to connect (across the fleet) that open the provider's breaker:
    #: dispatch to it pauses, and one call at a time probes it until one is answered
    breaker_after: int = Field(default=3, gt=0)
    #: the first probe comes this long after the breaker opened; each refused probe
    #: doubles the wait, up to `probe_max`
    probe_every: timedelta = timedelta(seconds=5)
    probe_max: timedelta = timedelta(minutes=5)

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None

    def claim_form(self) -> dict[str, float | int]:
        """The limits as the claim statement reads them (absent keys: no limit)."""
        form: dict[str, float | int] = {}
        if self.concurrency is not None:
            form["concurrency"] = self.concurrency
        if self.rate is not None:
            form["interval_s"] = 1.0 / self.rate
            form["burst"] = self.burst
        return form


class Contract(Record):
    """Everything the retry decision needs to know about one provider endpoint."""

    provider: str
    idempotency: Idempotency
    lookup: Lookup
    #: what a success response ties to our request (see `ResponseBinds`); a confirmation
    #: that lacks what the provider gives, or names another key or body, confirms nothing
    response_binds: ResponseBinds = "nothing"
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
    #: after this many attempts that reached the provider, a person decides ("still
    #: executing" answers and attempts that provably sent nothing do not count)
    max_attempts: int = 5
    #: what one effect is called in a sentence ("email", "payment", "change to the case"):
    #: the review's consequences say what a retry could repeat in these words
    effect: str = "effect"
    #: how hard the fleet may press on the provider (see `Limits`); none by default
    limits: Limits = Limits()
    #: where the numbers come from
    source: str = ""

    @model_validator(mode="after")
    def _consistent(self) -> Contract:
        if self.max_in_flight < self.request_timeout:
            raise ValueError("max_in_flight must be at least the request timeout")
        idem = self.idempotency
        if idem.conflict_wait > timedelta(0) and idem.conflict_wait >= self.request_timeout:
            raise ValueError(
                "the request timeout must exceed conflict_wait, or a concurrent request's "
                "refusal arrives after we gave up on it"
            )
        return self
