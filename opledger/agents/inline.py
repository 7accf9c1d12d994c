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
- an ambiguous answer: the operation is unknown, and a worker's reconcile is published;
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
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from opledger.ledger import InvalidInput, Status
from opledger.ledger.facades import WorkerLedger

if TYPE_CHECKING:
    from opledger.adapters.registry import Registry
    from opledger.tasks.config import WorkerConfig
    from opledger.tasks.hooks import Hooks
    from opledger.tasks.results import StepResult
    from opledger.tasks.worker import Worker

log = logging.getLogger("opledger.agents")

#: how long strict mode trusts what it read of the ledger's replication
REPLICATION_TTL_S = 5.0

#: how many threads dispatch through one `Inline` at once, by default (each uses one of
#: the ledger's connections for its claim and its outcome)
DEFAULT_CONCURRENCY = 8
#: how long a thread waits for one of those slots at most before a worker sends its act
SLOT_WAIT_S = 5.0


def owner() -> str:
    """The owner an inline claim is taken under: this process."""
    return f"inline:{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class _Deployment:
    """What an inline dispatch reads of the deployment: the worker settings, strict mode,
    and how long after a ledger switch an operation's first dispatch is suspect."""

    config: WorkerConfig
    strict: bool
    suspect: timedelta


class Inline:
    """Which acts an `Effects` dispatches in the caller's process, and how.

    `registry`: the adapters (the ledger's own when it was built with them); `actions`:
    the actions sent inline, as patterns (`"*"`, `"crm.*"`); `config`: the worker settings
    a dispatch reads (lease, provider wait; default: from the OPLEDGER_ environment);
    `hooks`: what observes its boundaries (traces and metrics by default); `publish_dispatch`
    publishes a dispatch to the workers (the `Effects`' own); `require_sync_standby`: strict
    mode (default: `OPLEDGER_REQUIRE_SYNC_STANDBY`); `concurrency`: how many threads
    dispatch through it at once (the others wait, unclaimed, at most `slot_wait` seconds or
    what is left of their wait, then a worker sends their act).

    The deployment's settings must be readable (`get_settings()`): where they are not, every
    act goes to a worker, as it does where strict mode finds no synchronous standby."""

    def __init__(
        self,
        registry: Registry,
        *,
        actions: Iterable[str] = ("*",),
        config: WorkerConfig | None = None,
        hooks: Hooks | None = None,
        publish_dispatch: Callable[[str], None] | None = None,
        require_sync_standby: bool | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        slot_wait: float = SLOT_WAIT_S,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency is at least 1")
        self.registry = registry
        self.actions = tuple(actions)
        self.concurrency = concurrency
        self.slot_wait = slot_wait
        self._config = config
        self._hooks = hooks
        self._publish_dispatch = publish_dispatch
        self._strict = require_sync_standby
        self._deployment: _Deployment | str | None = None
        self._workers: dict[tuple[int, str], Worker] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._slots = threading.BoundedSemaphore(concurrency)
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
        deployment = self.deployment()
        if isinstance(deployment, str):
            return deployment
        if deployment.strict:
            return self._unreplicated(ledger)
        return None

    def deployment(self) -> _Deployment | str:
        """The deployment's settings an inline dispatch reads (once), or why they cannot
        be read."""
        if self._deployment is None:
            from opledger.settings import SettingsInvalid, get_settings
            from opledger.tasks.config import WorkerConfig

            try:
                settings = get_settings()
            except SettingsInvalid as exc:
                self._deployment = f"this process's settings cannot be read ({exc})"
            else:
                self._deployment = _Deployment(
                    config=self._config or WorkerConfig.from_settings(settings),
                    strict=(
                        settings.require_sync_standby if self._strict is None else self._strict
                    ),
                    suspect=timedelta(seconds=settings.switch_suspect_seconds),
                )
        return self._deployment

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

    def dispatch(
        self, ledger: WorkerLedger, op_id: str, *, wait: float | None = None
    ) -> StepResult | None:
        """A worker's dispatch of the prepared `op_id`, in this thread (a no-op, `NOOP`,
        when it is no longer prepared: a worker took it first); None when no slot came
        within `wait` (at most `slot_wait`): nothing was claimed, and a worker sends it.

        At most `concurrency` threads dispatch at once; the others wait before they claim,
        so no claim waits on a crowd of busy threads past its send-by window. An act this
        dispatch left unknown (an ambiguous answer, nothing sent in time) is handed to a
        worker's reconcile at once: its lookup, wait or retry is a task's."""
        worker = self._worker(ledger)
        slots = self._slots_here()
        limit = self.slot_wait if wait is None else max(0.0, min(self.slot_wait, wait))
        if not slots.acquire(timeout=limit):
            return None
        try:
            step = worker.dispatch(op_id)
        finally:
            slots.release()
        op = step.operation
        # (a quarantined claim's reconcile is the worker step's own follow-up already)
        if step.action == "dispatched" and op is not None and op.status is Status.UNKNOWN:
            worker.follow_ups.reconcile(op_id)
        return step

    def _slots_here(self) -> threading.BoundedSemaphore:
        """The slots, made anew in a forked child (no thread of the parent holds one here,
        and the parent's lock may have been taken when it forked)."""
        if self._pid != os.getpid():
            self._slots, self._lock = threading.BoundedSemaphore(self.concurrency), threading.Lock()
            self._pid = os.getpid()
        return self._slots

    def _worker(self, ledger: WorkerLedger) -> Worker:
        """This process's worker over `ledger` (one per process: its owner is the pid)."""
        key = (id(ledger), owner())
        found = self._workers.get(key)
        if found is not None:
            return found
        self._slots_here()
        with self._lock:
            found = self._workers.get(key)
            if found is None:
                found = self._workers[key] = self._build(ledger, key[1])
        return found

    def _build(self, ledger: WorkerLedger, name: str) -> Worker:
        from opledger.tasks.config import FollowUps, claim_as_configured
        from opledger.tasks.hooks import HOOKS
        from opledger.tasks.worker import Worker

        deployment = self.deployment()
        assert not isinstance(deployment, str), "why_not is asked first"
        # a process that claims sees and records a ledger switch as the workers do
        claim_as_configured(ledger, suspect=deployment.suspect, synchronous=deployment.strict)
        return Worker(
            ledger,
            self.registry,
            owner=name,
            config=deployment.config,
            hooks=self._hooks or HOOKS,
            follow_ups=FollowUps(
                reconcile=_best_effort("opledger.reconcile"),
                review_opened=_best_effort("opledger.notify_review"),
                dispatch=self._publish_dispatch or _best_effort("opledger.dispatch"),
            ),
        )


def configured(
    ledger: object, inline: bool | Iterable[str] | Inline | None, publish: Callable[[str], None]
) -> Inline | None:
    """The inline dispatch an `Effects` over `ledger` is given (`Effects(..., inline=)`:
    True, action patterns, an `Inline`, False, or None for the deployment's), or None.
    `OPLEDGER_INLINE_DISPATCH=never` wins over whatever the code asks for."""
    if inline is False:
        return None
    if isinstance(inline, str):
        raise InvalidInput("inline names actions as a list of patterns", field="inline")
    setting = _setting()
    if setting is None:  # `never`: this process sends nothing itself
        if inline is not None:
            log.warning("OPLEDGER_INLINE_DISPATCH=never: every act is sent by a worker")
        return None
    if isinstance(inline, Inline):
        return inline
    patterns = setting if inline is None else ("*",) if inline is True else tuple(inline)
    registry = getattr(ledger, "actions", None)
    if not callable(getattr(registry, "adapter_for", None)):
        if inline is None:  # the deployment's: a process without adapters hands acts on
            if patterns:
                log.warning(
                    "OPLEDGER_INLINE_DISPATCH is set, but this ledger was built without its "
                    "adapters: every act is sent by a worker"
                )
            return None
        raise InvalidInput(
            "inline dispatch sends from this process: build the ledger with its adapters "
            "(Ledger.from_url(url, actions=load_registry(settings)))",
            field="inline",
        )
    return Inline(cast("Registry", registry), actions=patterns, publish_dispatch=publish)


def _setting() -> tuple[str, ...] | None:
    """`OPLEDGER_INLINE_DISPATCH` as this process's settings say (`from_setting`): off
    where they cannot be read (and an `Inline` then sends nothing: `Inline.why_not`)."""
    from opledger.settings import SettingsInvalid, get_settings

    try:
        settings = get_settings()
    except SettingsInvalid:
        return ()
    return from_setting(settings.inline_dispatch)


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


__all__ = ["Inline", "configured", "from_setting", "owner"]
