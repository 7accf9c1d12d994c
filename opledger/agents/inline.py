"""Dispatch in the agent's own process: the same fenced claim, the same adapter and the same
statements as a worker's dispatch, without the trip through the broker.

    effects = Effects(ledger, inline=True)         # the ledger built with its adapters
    effects.effect(..., wait=30)                   # claimed, sent and recorded right here

An `Effects` with inline dispatch hands a ready act to `Inline.dispatch`, which runs a
worker's own dispatch step (`tasks.worker.Worker.dispatch`) in the calling thread: the claim
under a new fence and a lease (its attempt row written in the same statement), the send-by
window checked before the request and at the wire, the adapter's call, the outcome recorded
under the fence. Nothing about the operation tells it from one a worker sent but the owner
of its claim and attempt (`inline:<host>:<pid>`). Everything that is not one uninterrupted
call goes to Celery, as it would from a worker:

- this process dies after the claim (SIGKILL, OOM, a deploy): the lease expires, the sweep
  fences it out and hands the operation to reconciliation, exactly as for a worker;
- an ambiguous answer: the operation is unknown, and the sweep hands its check out;
- no room at the provider beyond the short wait a worker would make: deferred, and the relay
  publishes it when room comes; fenced out, quarantined, a review opened: the follow-up a
  worker would publish is published (`opledger.reconcile`, `opledger.notify_review`).

An act is dispatched inline only where this process can send it: an adapter of the
ledger's registry serves its action (`Ledger.from_url(..., actions=load_registry(...))`),
the deployment allows it (`OPLEDGER_INLINE_DISPATCH`) and, in strict mode
(`OPLEDGER_REQUIRE_SYNC_STANDBY`), the ledger's commits wait for a synchronous standby.
Otherwise it is published to a worker, as without inline dispatch; `why_not` says why.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from opledger.ledger import Status
from opledger.ledger.facades import WorkerLedger

if TYPE_CHECKING:
    from opledger.adapters.registry import Registry
    from opledger.tasks.hooks import Hooks
    from opledger.tasks.results import StepResult
    from opledger.tasks.worker import Worker, WorkerConfig

log = logging.getLogger("opledger.agents")

#: how long strict mode trusts what it read of the ledger's replication
REPLICATION_TTL_S = 5.0

#: how many threads of one process dispatch inline at once, by default (each uses one of
#: the ledger's connections for its claim and its outcome)
DEFAULT_CONCURRENCY = 8


def owner() -> str:
    """The owner an inline claim is taken under: this process."""
    return f"inline:{socket.gethostname()}:{os.getpid()}"


class Inline:
    """Which acts an `Effects` dispatches in the caller's process, and how.

    `registry`: the adapters (the ledger's own when it was built with them); `actions`:
    the actions sent inline, as patterns (`"*"`, `"crm.*"`); `config`: the worker settings
    a dispatch reads (lease, provider wait; default: from the OPLEDGER_ environment);
    `hooks`: what observes its boundaries (traces and metrics by default); `publish_dispatch`
    publishes a dispatch to the workers (the `Effects`' own); `require_sync_standby`: strict
    mode, as the workers'; `concurrency`: how many threads of this process dispatch at
    once (the others wait, unclaimed)."""

    def __init__(
        self,
        registry: Registry,
        *,
        actions: Iterable[str] = ("*",),
        config: WorkerConfig | None = None,
        hooks: Hooks | None = None,
        publish_dispatch: Callable[[str], None] | None = None,
        require_sync_standby: bool = False,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency is at least 1")
        self.registry = registry
        self.concurrency = concurrency
        self._slots = threading.BoundedSemaphore(concurrency)
        self.actions = tuple(actions)
        self._config = config
        self._hooks = hooks
        self._publish_dispatch = publish_dispatch
        self.require_sync_standby = require_sync_standby
        self._workers: dict[tuple[int, str], Worker] = {}
        self._lock = threading.Lock()
        self._replication: tuple[float, str | None] = (-REPLICATION_TTL_S, None)

    def covers(self, action: str) -> bool:
        """Whether `action` is one this deployment sends inline when nothing else says."""
        return any(fnmatch.fnmatchcase(action, pattern) for pattern in self.actions)

    def why_not(self, ledger: object, action: str) -> str | None:
        """Why an act of `action` cannot be sent from this process now (then a worker sends
        it), or None."""
        from opledger.ledger import UnknownAction

        try:
            self.registry.adapter_for(action)
        except UnknownAction:
            return f"no adapter of this process serves {action}"
        if self.require_sync_standby:
            return self._unreplicated(ledger)
        return None

    def _unreplicated(self, ledger: object) -> str | None:
        """Strict mode: why nothing may be claimed now (read at most every few seconds)."""
        read_at, why = self._replication
        if time.monotonic() - read_at >= REPLICATION_TTL_S:
            read = getattr(ledger, "replication", None)
            if not callable(read):
                return "OPLEDGER_REQUIRE_SYNC_STANDBY: this ledger cannot say how it replicates"
            replication = read()
            why = None if replication.durable_on_failover else replication.summary()
            if why is not None:
                why = f"OPLEDGER_REQUIRE_SYNC_STANDBY: {why}"
            self._replication = (time.monotonic(), why)
        return why

    def dispatch(self, ledger: WorkerLedger, op_id: str) -> StepResult:
        """A worker's dispatch of the prepared `op_id`, in this thread (a no-op, `NOOP`,
        when it is no longer prepared: a worker took it first).

        At most `concurrency` of this process's threads dispatch at once; the others wait
        before they claim, so no claim waits on a crowd of busy threads past its send-by
        window. An act left unknown (an ambiguous answer, nothing sent in time) is handed
        to a worker's reconcile at once: its lookup, wait or retry is a task's."""
        worker = self._worker(ledger)
        with self._slots:
            step = worker.dispatch(op_id)
        op = step.operation
        if op is not None and op.status is Status.UNKNOWN:
            worker.follow_ups.reconcile(op_id)
        return step

    def _worker(self, ledger: WorkerLedger) -> Worker:
        """This process's worker over `ledger` (one per process: its owner is the pid)."""
        key = (id(ledger), owner())
        found = self._workers.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._workers.get(key)
            if found is None:
                found = self._workers[key] = self._build(ledger, key[1])
        return found

    def _build(self, ledger: WorkerLedger, name: str) -> Worker:
        from opledger.tasks.hooks import HOOKS
        from opledger.tasks.worker import FollowUps, Worker, WorkerConfig

        config = self._config
        if config is None:
            from opledger.settings import SettingsInvalid, get_settings

            try:
                config = WorkerConfig.from_settings(get_settings())
            except SettingsInvalid:  # the settings an agent's process cannot read
                config = WorkerConfig()
        return Worker(
            ledger,
            self.registry,
            owner=name,
            config=config,
            hooks=self._hooks or HOOKS,
            follow_ups=FollowUps(
                reconcile=_best_effort("opledger.reconcile"),
                review_opened=_best_effort("opledger.notify_review"),
                dispatch=self._publish_dispatch or _best_effort("opledger.dispatch"),
            ),
        )


def _best_effort(task: str) -> Callable[[str], None]:
    """Publish `task` for an operation through opledger's publishing app; a broker that
    does not take it is logged (the sweep and the relay come back to the operation)."""

    def publish(op_id: str) -> None:
        from opledger.tasks.app import publishing_app

        try:
            publishing_app().tasks[task].apply_async((op_id,))
        except Exception as exc:  # kombu/redis/amqp errors differ by transport
            log.warning(
                "%s for %s not published (%s: %s); the sweep comes back to it",
                task,
                op_id,
                type(exc).__name__,
                exc,
                extra={"op_id": op_id},
            )

    return publish


def from_setting(value: str) -> tuple[str, ...] | None:
    """`OPLEDGER_INLINE_DISPATCH` as action patterns: `off` (or empty) none, `on` or `*`
    every action, else patterns separated by commas; None for `never` (this process never
    sends, even when a call asks)."""
    said = value.strip()
    if said.lower() == "never":
        return None
    if said.lower() in ("", "off"):
        return ()
    if said.lower() == "on":
        return ("*",)
    return tuple(p.strip() for p in said.split(",") if p.strip())


__all__ = ["Inline", "from_setting", "owner"]
