"""`opledger contract check`: compare a declared contract with what the provider does.

A wrong contract is how a duplicate gets through, so before trusting one, exercise what
can be observed in seconds against the provider's test endpoint: the same key replayed;
the same key with another payload; two concurrent requests with one key; whether the
response names our key and the body it executed; the longest key accepted; what the
lookup answers for a request it made (found, and what that binds) and for one it never
made (absent). What needs a fault injected (a failure after the change, a restart, a
request held so that two overlap) no provider's test endpoint offers: the caller hands in
`FaultProbes` that can (opledger's sandbox: `opledger.dev.faultprobes`); without them
the first two are "not observable" and the two requests are sent as they come. A fact
the endpoint gives no way to test is "not observable", never a traceback: what was found
before is still reported. Every probe is a real request with a fresh target and a fresh
key, so it runs only against loopback or the test URL the adapter declares, unless the
caller explicitly accepts the risk. Each disagreement carries the change it asks for
(`opledger.adapters.hints`): the field, its value, and whether the declared fact
over-promised.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from opledger.ledger import Ambiguous, Attempt, Claim, Confirmed, Evidence, Operation, Outcome
from opledger.ledger.canonical import canonicalize
from opledger.ledger.contract import Contract
from opledger.ledger.evidence import LOOKUP, binding_clashes, binds
from opledger.ledger.ids import new_operation_id
from opledger.ledger.models import Record, Status
from opledger.ledger.models import Verdict as Says
from opledger.net import is_loopback

from .base import IDEMPOTENCY_MISMATCH, IN_FLIGHT, Adapter, LookupResult, extra
from .hints import hint_for

#: "not observed": probed, but what came back could not tell; "not observable": this
#: endpoint gives no way to probe it (no fault routes, no lookup declared)
Verdict = Literal["agrees", "disagrees", "not observed", "not observable"]

#: how long a lookup probe waits for a lagging search to show our request
LOOKUP_WAIT_CAP = timedelta(seconds=15)


class Finding(Record):
    """One fact: what the contract declares, what the provider did, and whether they agree."""

    fact: str
    declared: str
    observed: str
    verdict: Verdict
    #: on a disagreement: the field to change and to what, and what the probe saw
    hint: str = ""
    #: the declared fact promises more than the provider keeps: a duplicate's way through
    over_promises: bool = False


class Probe(Protocol):
    """What an adapter sends when its contract is checked: an action, a fresh target, and
    a payload that differs with `variant`."""

    def __call__(self, variant: int) -> tuple[str, str, dict[str, Any]]: ...


class FaultProbes(Protocol):
    """What an endpoint that can inject faults offers the check, beyond what any
    provider's test endpoint does (opledger's sandbox: `opledger.dev.faultprobes`)."""

    def overlapping(self, session: ProbeSession) -> AbstractContextManager[float]:
        """While inside, each request `session` sends executes this many seconds (what it
        yields), so two with one key overlap."""
        ...

    def facts(self, session: ProbeSession, contract: Contract) -> list[Finding]:
        """`after_error` (what a failure after the change does to the key) and
        `keys_durable` (whether keys survive a restart)."""
        ...


#: why `after_error` and `keys_durable` are not observable without `FaultProbes`
NO_FAULTS = "needs an endpoint that can inject a failure and a restart (--admin-url)"


def faults_not_observable(contract: Contract, why: str) -> list[Finding]:
    """`after_error` and `keys_durable`, "not observable" for `why`."""
    idem = contract.idempotency
    facts = (("after_error", idem.after_error), ("keys_durable", str(idem.keys_durable).lower()))
    return [
        Finding(fact=fact, declared=declared, observed=why, verdict="not observable")
        for fact, declared in facts
    ]


class UnsafeTarget(Exception):
    """The adapter points at an endpoint that is neither loopback nor its declared test URL."""


def endpoint_is_safe(adapter: Adapter) -> bool:
    """Loopback, or the test URL the adapter declares (`test_base_url`)."""
    base = str(extra(adapter, "base_url") or extra(adapter, "url") or "")
    test_url = extra(adapter, "test_base_url")
    if test_url and base.rstrip("/") == str(test_url).rstrip("/"):
        return True
    return is_loopback(urlsplit(base).hostname or extra(adapter, "host") or "")


class ProbeSession:
    """Sends probe requests through the adapter itself, with synthetic claims: the exact
    bytes, headers and error mapping production uses, and nothing written to a ledger."""

    def __init__(self, adapter: Adapter, probe: Probe) -> None:
        self.adapter, self.probe = adapter, probe
        self.run = uuid.uuid4().hex[:8]
        #: one operation per key: a retry of a real operation carries the same id (and
        #: whatever the adapter derives from it, such as a marker in the body)
        self._ids: dict[str, str] = {}

    def claim(self, key: str, variant: int = 0, target: str | None = None) -> Claim:
        action, default_target, payload = self.probe(variant)
        frozen = canonicalize(payload)
        now = datetime.now(UTC)
        op = Operation(
            id=self._ids.setdefault(key, new_operation_id()),
            tenant="contract-check",
            workflow_id=f"check-{self.run}",
            intent_key=key,
            action=action,
            target=target or default_target,
            provider=self.adapter.contract.provider,
            payload_digest=frozen.digest,
            payload_size=frozen.size,
            authorization_ref="contract-check",
            status=Status.DISPATCHING,
            fence=1,
            lease_owner="contract-check",
            lease_expires_at=now + timedelta(minutes=1),
            idempotency_key=key,
            provider_result_id=None,
            evidence_checked_at=None,
            next_check_at=None,
            record_version=1,
            created_at=now,
            updated_at=now,
        )
        return Claim(
            fence=1,
            token="contract-check",
            owner="contract-check",
            attempt_n=1,
            started_at=now,
            deadline_at=now + self.adapter.contract.max_in_flight,
            payload=payload,
            payload_canonical=frozen.text,
            operation=op,
        )

    def key(self, length: int | None = None) -> str:
        key = f"chk_{self.run}_{uuid.uuid4().hex}"
        if length is not None:
            key = (key * (length // len(key) + 1))[:length]
        return key

    def send(self, claim: Claim) -> Outcome:
        return self.adapter.dispatch(claim)

    def lookup(self, claim: Claim, *, sent: bool) -> LookupResult:
        """The adapter's lookup for `claim`'s operation, as the reconciler asks it: with
        the attempt that was sent (none when the request never was)."""
        attempts = [_attempt_of(claim)] if sent else []
        return self.adapter.lookup(claim.operation, attempts)


def _attempt_of(claim: Claim) -> Attempt:
    return Attempt(
        op_id=claim.op_id,
        n=claim.attempt_n,
        fence=claim.fence,
        owner=claim.owner,
        idempotency_key=claim.idempotency_key,
        started_at=claim.started_at,
        deadline_at=claim.deadline_at,
        finished_at=datetime.now(UTC),
        outcome="confirmed",
        response=None,
        authorized_by="contract-check",
    )


def seen(outcome: Outcome) -> str:
    if isinstance(outcome, Confirmed):
        replay = " (replayed)" if outcome.detail.get("replayed") else ""
        return f"success {outcome.receipt_id}{replay}"
    return f"{outcome.kind} {outcome.code}"


def applied_twice(first: Outcome, second: Outcome) -> bool | None:
    """Did the second request with the same key make a change of its own?"""
    if not isinstance(first, Confirmed) or not isinstance(second, Confirmed):
        return None
    if second.detail.get("replayed"):
        return False
    return second.receipt_id != first.receipt_id


def check_contract(
    adapter: Adapter,
    probe: Probe,
    *,
    allow_remote: bool = False,
    faults: FaultProbes | None = None,
) -> list[Finding]:
    """Exercise the provider behind `adapter` and compare with `adapter.contract`.

    `faults`: what can inject a failure after the change, a restart and a slow request
    (the sandbox's admin routes; real providers offer none: those facts are then
    reported as not observable).
    """
    if not (allow_remote or endpoint_is_safe(adapter)):
        raise UnsafeTarget(
            "the adapter points at neither loopback nor its declared test URL: the check sends "
            "real requests that change things there"
        )
    contract = adapter.contract
    s = ProbeSession(adapter, probe)
    # 1. the same key twice, the same body
    key = s.key()
    first = s.send(s.claim(key))
    if not isinstance(first, Confirmed):
        return [
            Finding(
                fact="probe", declared="a success", observed=seen(first), verdict="not observed"
            )
        ]
    findings: list[Finding] = []
    for fact, declared, run in _probes(s, contract, key, first, faults):
        findings += _observe(fact, declared, run)
    if contract.idempotency.kind == "keyed":
        # 7, 8. what a failure after the change does to the key; a restart
        if faults is None:
            findings += faults_not_observable(contract, NO_FAULTS)
        else:
            findings += faults.facts(s, contract)
    return [_with_hint(f, contract) for f in findings]


def _with_hint(finding: Finding, contract: Contract) -> Finding:
    """A disagreement with the change it asks for (`opledger.adapters.hints`)."""
    if finding.verdict != "disagrees":
        return finding
    hint = hint_for(finding.fact, finding.declared, finding.observed, contract)
    if hint is None:
        return finding
    return finding.model_copy(update={"hint": str(hint), "over_promises": hint.over_promises})


def _probes(
    s: ProbeSession, contract: Contract, key: str, first: Confirmed, faults: FaultProbes | None
) -> list[tuple[str, str, Callable[[], Finding | list[Finding]]]]:
    """Each probe after the first request: its fact, what the contract declares, the run."""
    idem = contract.idempotency
    probes: list[tuple[str, str, Callable[[], Finding | list[Finding]]]] = [
        # 2. what the response binds
        ("idempotency", idem.kind, lambda: _idempotency(s, contract, key, first)),
        ("response_binds", contract.response_binds, lambda: _binding(s, contract, key, first)),
        # 3. what the lookup finds for a request we made, and for one we never made
        ("lookup", contract.lookup.kind, lambda: _lookups(s, contract, key)),
    ]
    if idem.kind == "keyed":
        probes += [
            # 4. the same key with another body
            (
                "payload_checked",
                str(idem.payload_checked).lower(),
                lambda: _payload_checked(s, contract, key, first),
            ),
            # 5. two requests with one key at once
            ("concurrent", idem.concurrent, lambda: _concurrent(s, contract, faults)),
            # 6. the longest key
            ("max_key_length", str(idem.max_key_length), lambda: _key_length(s, contract)),
        ]
    return probes


def _observe(
    fact: str, declared: str, probe: Callable[[], Finding | list[Finding]]
) -> list[Finding]:
    """Run one probe; whatever goes wrong in it, the findings so far are kept."""
    try:
        found = probe()
    except Exception as exc:  # an endpoint without what the probe needs
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        found = Finding(
            fact=fact,
            declared=declared,
            observed=f"could not be probed here ({why})",
            verdict="not observable",
        )
    return found if isinstance(found, list) else [found]


def _payload_checked(s: ProbeSession, contract: Contract, key: str, first: Confirmed) -> Finding:
    idem = contract.idempotency
    other = s.send(s.claim(key, variant=1, target=first.binding.target or None))
    refused = isinstance(other, Ambiguous) and other.code == IDEMPOTENCY_MISMATCH
    observed = "refused as another payload" if refused else f"not refused: {seen(other)}"
    return Finding(
        fact="payload_checked",
        declared=str(idem.payload_checked).lower(),
        observed=observed,
        verdict="agrees" if refused == idem.payload_checked else "disagrees",
    )


def _lookups(s: ProbeSession, contract: Contract, key: str) -> list[Finding]:
    """The lookup asked about the request just made (found? binding this operation?) and
    about one never made (absent, or at least not found)."""
    kind = contract.lookup.kind
    if kind == "none":
        return [
            Finding(
                fact="lookup",
                declared="none",
                observed="the contract declares no lookup",
                verdict="not observable",
            )
        ]
    declared = kind + (
        f", {contract.lookup.lag.total_seconds():g} s behind" if kind == "search" else ""
    )
    sent = s.claim(key)
    wait = min(contract.lookup.lag + timedelta(seconds=2), LOOKUP_WAIT_CAP).total_seconds()
    deadline = time.monotonic() + wait
    found = s.lookup(sent, sent=True)
    while found.verdict != Says.CONFIRMED and time.monotonic() < deadline:
        time.sleep(min(0.5, max(wait / 10, 0.05)))
        found = s.lookup(sent, sent=True)
    findings = [_found(contract, found, declared, wait)]
    if found.verdict == Says.CONFIRMED:
        findings.append(_lookup_binds(contract, sent, found))
    never = s.claim(s.key())  # a fresh operation and key, never sent
    absent = s.lookup(never, sent=False)
    says = absent.verdict.value
    if absent.verdict in (Says.CONFIRMED, Says.REJECTED):
        verdict: Verdict = "disagrees"  # it would settle what never happened
        observed = f"{says} for a request never made"
    elif kind == "status_api":  # authoritative: "no such request", or it is no status API
        verdict = "agrees" if absent.verdict == Says.ABSENT else "disagrees"
        observed = f"{says} for a request never made"
    else:  # a search that finds nothing proves nothing, and may say so
        verdict = "agrees"
        observed = f"{says} for a request never made"
    findings.append(
        Finding(
            fact="lookup_absent",
            declared="absent" if kind == "status_api" else "not found",
            observed=observed,
            verdict=verdict,
        )
    )
    return findings


def _found(contract: Contract, found: LookupResult, declared: str, waited: float) -> Finding:
    says = found.verdict.value
    if found.verdict == Says.CONFIRMED:
        observed, verdict = "found the request just made", "agrees"
    elif found.verdict == Says.REJECTED:
        # the decision would record a refusal of what the provider applied
        observed, verdict = "rejected the request just made", "disagrees"
    elif contract.lookup.kind == "status_api":
        # an authoritative "no such request" for one that was applied would let a retry
        # repeat it; any other answer means the declared status API does not answer
        observed, verdict = f"{says} for the request just made", "disagrees"
    else:
        reason = found.detail.get("error") or found.detail.get("reason") or ""
        observed = f"{says} within {waited:g} s" + (f" ({reason})" if reason else "")
        verdict = "not observed"
    return Finding(fact="lookup", declared=declared, observed=observed, verdict=verdict)


def _lookup_binds(contract: Contract, sent: Claim, found: LookupResult) -> Finding:
    """Whether what the lookup found binds this operation, as the decision reads it."""
    op = sent.operation
    b = found.binding
    named = [
        name
        for name, value in (
            ("key", b.idempotency_key),
            ("receipt", b.receipt_id),
            ("target", b.target),
            ("digest", b.payload_digest),
        )
        if value is not None
    ]
    evidence = Evidence(
        id=0,
        op_id=op.id,
        attempt_n=None,
        fence=None,
        source=LOOKUP,
        verdict=found.verdict,
        binding=b,
        detail=dict(found.detail),
        applied=False,
        recorded_at=datetime.now(UTC),
    )
    ours = binds(evidence, op, frozenset({op.idempotency_key}), contract)
    clashes = binding_clashes(b, op, op.idempotency_key)
    observed = ", ".join(named) or "nothing"
    if clashes:
        observed += f"; contradicts our {', '.join(clashes)}"
    return Finding(
        fact="lookup_binds",
        declared="this operation",
        observed=observed if ours else f"{observed}: not enough to confirm it",
        verdict="agrees" if ours else "disagrees",
    )


def _idempotency(s: ProbeSession, contract: Contract, key: str, first: Confirmed) -> Finding:
    """Whether the same key and body sent twice is applied twice."""
    keyed = contract.idempotency.kind == "keyed"
    second = s.send(s.claim(key, target=first.binding.target or None))
    twice = applied_twice(first, second)
    declared = "keyed" if keyed else "none"
    if twice is None:
        return Finding(
            fact="idempotency",
            declared=declared,
            observed=f"second request: {seen(second)}",
            verdict="not observed",
        )
    observed = "applied twice under one key" if twice else "answered from the key"
    verdict: Verdict = "agrees" if twice != keyed else "disagrees"
    return Finding(fact="idempotency", declared=declared, observed=observed, verdict=verdict)


def _binding(s: ProbeSession, contract: Contract, key: str, first: Confirmed) -> Finding:
    """What the provider's success binds: our key, the body's digest, or nothing."""
    b = first.binding
    gives = (
        "key_and_digest"
        if b.idempotency_key and b.payload_digest
        else "key"
        if b.idempotency_key
        else "nothing"
    )
    if b.payload_digest is not None and b.payload_digest != s.claim(key).operation.payload_digest:
        gives = "another body's digest"
    return Finding(
        fact="response_binds",
        declared=contract.response_binds,
        observed=gives,
        verdict="agrees" if gives == contract.response_binds else "disagrees",
    )


def _concurrent(s: ProbeSession, contract: Contract, faults: FaultProbes | None) -> Finding:
    declared: str = contract.idempotency.concurrent
    slow = faults.overlapping(s) if faults is not None else contextlib.nullcontext(0.0)
    with slow as delay_s:
        key = s.key()
        claims = [s.claim(key), s.claim(key)]
        results: list[tuple[Outcome, float]] = [None, None]  # type: ignore[list-item]

        def go(i: int) -> None:
            start = time.monotonic()
            results[i] = (s.send(claims[i]), time.monotonic() - start)

        threads = [threading.Thread(target=go, args=(i,)) for i in (0, 1)]
        threads[0].start()
        time.sleep(min(0.05, delay_s / 4) if delay_s else 0.01)
        threads[1].start()
        for t in threads:
            t.join()
    (a, _), (b, waited) = results
    # refused as in progress by the provider's code: what the decision reads as such (a 409
    # without a code is unknown to it, so it proves nothing here either)
    conflict = any(isinstance(o, Ambiguous) and o.code == IN_FLIGHT for o in (a, b))
    both = isinstance(a, Confirmed) and isinstance(b, Confirmed)
    if conflict:
        wait = f" after {waited:.1f} s" if waited >= 1 else ""
        verdict: Verdict = "agrees" if declared == "conflict" else "disagrees"
        declared_wait = contract.idempotency.conflict_wait.total_seconds()
        if declared == "conflict" and waited >= 1 and declared_wait < waited / 2:
            verdict = "disagrees"  # a wait the contract does not state (conflict_wait)
        if declared_wait:
            declared += f" after {declared_wait:g} s"
        return Finding(
            fact="concurrent",
            declared=declared,
            observed=f"the second was refused as in progress{wait}",
            verdict=verdict,
        )
    if both and applied_twice(a, b):
        return Finding(
            fact="concurrent",
            declared=declared,
            observed="both executed",
            verdict="agrees" if declared == "unchecked" else "disagrees",
        )
    return Finding(
        fact="concurrent",
        declared=declared,
        observed=f"not concurrent enough to tell ({seen(a)}; {seen(b)})",
        verdict="not observed",
    )


def _key_length(s: ProbeSession, contract: Contract) -> Finding:
    limit = contract.idempotency.max_key_length
    probe_len = limit if limit is not None else 300
    at_limit = s.send(s.claim(s.key(probe_len)))
    accepted = isinstance(at_limit, Confirmed)
    if limit is None:
        return Finding(
            fact="max_key_length",
            declared="no limit",
            observed=f"a {probe_len}-character key: {seen(at_limit)}",
            verdict="agrees" if accepted else "disagrees",
        )
    # the contract promises the provider accepts keys this long; a provider that accepts
    # longer ones too does not contradict it (opledger never sends longer ones)
    return Finding(
        fact="max_key_length",
        declared=str(limit),
        observed=f"a {limit}-character key: {seen(at_limit)}",
        verdict="agrees" if accepted else "disagrees",
    )


def probe_for(adapter: Adapter) -> Probe | None:
    """The adapter's own probe (`contract_probe`), if it offers one."""
    probe = extra(adapter, "contract_probe")
    return probe if callable(probe) else None


__all__ = [
    "NO_FAULTS",
    "FaultProbes",
    "Finding",
    "Probe",
    "ProbeSession",
    "UnsafeTarget",
    "Verdict",
    "applied_twice",
    "check_contract",
    "endpoint_is_safe",
    "faults_not_observable",
    "probe_for",
    "seen",
]
