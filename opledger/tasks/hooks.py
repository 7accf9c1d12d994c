"""The worker's boundaries, and what observes them: traces, metrics and crash points.

`tasks.steps` is the algorithm alone. At each boundary it opens `hooks.<boundary>(...)`, a
context manager around that part of the work, and tells the `Watch` it yields what
happened; each observer implements the same boundaries, as dramatiq keeps one middleware
per concern:

    claim(op_id, retry)      taking the fenced claim (a dispatch's, or reconcile's retry)
    call(claim, provider)    the adapter's dispatch; `sending()` right before the request,
                             `answered()` when the adapter returned
    record(op_id, fence, source, provider)
                             recording an outcome: a provider's answer, or evidence
    decide(op_id)            reconcile's decision, its lookups included
    lookup(op)               one lookup at the provider

and two events outside them: `fenced_out(where)`, another claim moved the operation
first; `relayed()`, the relay published its messages and has not marked them yet.
A watch is told `operation`, `claim`, `sending`, `answered`, `outcome`, `status`,
`decision`, `verdict`, `fenced`, `error` and `set` — whatever of that its boundary learns.

`Tracing` opens `observability.tracing`'s spans (which are watches), `Metrics` counts in
`observability.metrics`; `HOOKS`, a production worker's hooks, runs the two. The crash
points of the development harness are a third observer of the same boundaries
(`opledger.dev.crashpoints.CrashPoints`), which a worker gets only in development mode
(`opledger worker` with `OPLEDGER_DEV=1` and `OPLEDGER_CRASHPOINT`, through
`cli.devmode`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

from opledger.ledger import Claim, Operation
from opledger.observability import metrics, tracing


class Watch:
    """What a boundary is told as it happens. Every method is optional: this one ignores
    everything, and an observer overrides what it cares about."""

    def operation(self, op: Operation) -> None:
        """The operation it is about, as it stands."""

    def claim(self, claim: Claim) -> None:
        """The claim was taken."""

    def sending(self) -> None:
        """The send-by window held: the request leaves next."""

    def answered(self) -> None:
        """The adapter's dispatch returned (an outcome, not an exception)."""

    def outcome(self, outcome: Any) -> None:
        """What came back (an `Outcome`), or what is being recorded."""

    def status(self, status: Any) -> None:
        """The status the operation ended in."""

    def decision(self, decision: Any, lookups: int) -> None:
        """The decision, after `lookups` lookups."""

    def verdict(self, verdict: Any) -> None:
        """A lookup's verdict."""

    def fenced(self) -> None:
        """This boundary's write was refused: another claim moved the operation first."""

    def error(self, exc: BaseException) -> None:
        """An error the step handled (an adapter that raised)."""

    def set(self, key: str, value: Any) -> None:
        """A named fact (a span attribute)."""


NOWATCH = Watch()


class Hooks:
    """An observer of the worker's boundaries. This one observes nothing."""

    def claim(self, op_id: str, *, retry: bool = False) -> AbstractContextManager[Watch]:
        return nullcontext(NOWATCH)

    def call(self, claim: Claim, provider: str) -> AbstractContextManager[Watch]:
        return nullcontext(NOWATCH)

    def record(
        self, op_id: str, fence: int, source: str, provider: str
    ) -> AbstractContextManager[Watch]:
        return nullcontext(NOWATCH)

    def decide(self, op_id: str) -> AbstractContextManager[Watch]:
        return nullcontext(NOWATCH)

    def lookup(self, op: Operation) -> AbstractContextManager[Watch]:
        return nullcontext(NOWATCH)

    def fenced_out(self, where: str) -> None:
        """Another claim moved the operation first (`where`: "outcome", "reconcile")."""

    def relayed(self) -> None:
        """The relay published its messages; it has not marked them as published yet."""


class Tracing(Hooks):
    """OpenTelemetry spans (`observability.tracing`; no-ops while traces are off)."""

    def claim(self, op_id: str, *, retry: bool = False) -> AbstractContextManager[Watch]:
        return tracing.claim(op_id)  # type: ignore[return-value]

    def call(self, claim: Claim, provider: str) -> AbstractContextManager[Watch]:
        return tracing.provider_call(claim)  # type: ignore[return-value]

    def record(
        self, op_id: str, fence: int, source: str, provider: str
    ) -> AbstractContextManager[Watch]:
        return tracing.outcome(op_id, fence, source)  # type: ignore[return-value]

    def decide(self, op_id: str) -> AbstractContextManager[Watch]:
        return tracing.decide(op_id)  # type: ignore[return-value]

    def lookup(self, op: Operation) -> AbstractContextManager[Watch]:
        return tracing.lookup(op)  # type: ignore[return-value]


class _Latency(Watch):
    def __init__(self, provider: str) -> None:
        self.provider = provider
        self.started: float | None = None

    def sending(self) -> None:
        self.started = time.perf_counter()

    def answered(self) -> None:
        """Only a dispatch that returned is timed (not one that raised)."""
        if self.started is not None:
            latency = time.perf_counter() - self.started
            metrics.PROVIDER_LATENCY.labels(self.provider).observe(latency)
            self.started = None


class _Outcomes(Watch):
    def __init__(self, provider: str) -> None:
        self.provider = provider

    def outcome(self, outcome: Any) -> None:
        metrics.DISPATCH_OUTCOMES.labels(self.provider, outcome.kind).inc()


class _Decisions(Watch):
    def decision(self, decision: Any, lookups: int) -> None:
        metrics.DECISIONS.labels(type(decision).__name__).inc()


class Metrics(Hooks):
    """Prometheus counters (`observability.metrics`; no-ops without the extra): provider
    latency, dispatch outcomes, decisions, fenced-out writes."""

    def call(self, claim: Claim, provider: str) -> AbstractContextManager[Watch]:
        return nullcontext(_Latency(provider))

    def record(
        self, op_id: str, fence: int, source: str, provider: str
    ) -> AbstractContextManager[Watch]:
        return nullcontext(_Outcomes(provider) if source == "provider" else NOWATCH)

    def decide(self, op_id: str) -> AbstractContextManager[Watch]:
        return nullcontext(_Decisions())

    def fenced_out(self, where: str) -> None:
        metrics.FENCED_OUT.labels(where).inc()


class _Each(Watch):
    """Tells every watch of a boundary."""

    def __init__(self, watches: Sequence[Watch]) -> None:
        self.watches = watches

    def operation(self, op: Operation) -> None:
        for w in self.watches:
            w.operation(op)

    def claim(self, claim: Claim) -> None:
        for w in self.watches:
            w.claim(claim)

    def sending(self) -> None:
        for w in self.watches:
            w.sending()

    def answered(self) -> None:
        for w in self.watches:
            w.answered()

    def outcome(self, outcome: Any) -> None:
        for w in self.watches:
            w.outcome(outcome)

    def status(self, status: Any) -> None:
        for w in self.watches:
            w.status(status)

    def decision(self, decision: Any, lookups: int) -> None:
        for w in self.watches:
            w.decision(decision, lookups)

    def verdict(self, verdict: Any) -> None:
        for w in self.watches:
            w.verdict(verdict)

    def fenced(self) -> None:
        for w in self.watches:
            w.fenced()

    def error(self, exc: BaseException) -> None:
        for w in self.watches:
            w.error(exc)

    def set(self, key: str, value: Any) -> None:
        for w in self.watches:
            w.set(key, value)


class All(Hooks):
    """Several observers at once, entered in order (the first is outermost)."""

    def __init__(self, *hooks: Hooks) -> None:
        self.hooks = hooks

    @contextmanager
    def _each(self, open_: Callable[[Hooks], AbstractContextManager[Watch]]) -> Iterator[Watch]:
        with ExitStack() as stack:  # each opened in turn: a span starts after a crash point
            yield _Each([stack.enter_context(open_(h)) for h in self.hooks])

    def claim(self, op_id: str, *, retry: bool = False) -> AbstractContextManager[Watch]:
        return self._each(lambda h: h.claim(op_id, retry=retry))

    def call(self, claim: Claim, provider: str) -> AbstractContextManager[Watch]:
        return self._each(lambda h: h.call(claim, provider))

    def record(
        self, op_id: str, fence: int, source: str, provider: str
    ) -> AbstractContextManager[Watch]:
        return self._each(lambda h: h.record(op_id, fence, source, provider))

    def decide(self, op_id: str) -> AbstractContextManager[Watch]:
        return self._each(lambda h: h.decide(op_id))

    def lookup(self, op: Operation) -> AbstractContextManager[Watch]:
        return self._each(lambda h: h.lookup(op))

    def fenced_out(self, where: str) -> None:
        for h in self.hooks:
            h.fenced_out(where)

    def relayed(self) -> None:
        for h in self.hooks:
            h.relayed()


#: what a production worker observes its boundaries with: traces, then metrics
HOOKS: Hooks = All(Tracing(), Metrics())

__all__ = ["HOOKS", "NOWATCH", "All", "Hooks", "Metrics", "Tracing", "Watch"]
