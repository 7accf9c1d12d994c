"""The Celery app and opledger's tasks.

Every task's only argument is an operation id (beat tasks take none): no payload and no
customer data ever travels through the broker or shows in Flower. Code outside a worker
calls ``publish_dispatch(op_id)`` after `Ledger.prepare` (from any thread: it names its
app, where ``dispatch.delay`` would use the thread's current one).

The tasks are shared tasks on one base class (`OperationTask`): they belong to whichever
Celery app runs them — opledger's own `app` below (`opledger worker`) or an app of yours
configured the same way. A transient database error (connection lost, restart,
serialization failure) is retried by Celery's `autoretry_for` with exponential backoff; a
setup error (a missing table, invalid settings) is not retried: it fails the task loudly.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar, cast

from celery import Celery, Task, shared_task
from celery.signals import before_task_publish, celeryd_init, import_modules, worker_process_init

from opledger.adapters.registry import Registry, load_registry
from opledger.ledger import (
    DatabaseUnavailable,
    Ledger,
    MalformedOperationId,
    OperationNotFound,
    UnknownAction,
)
from opledger.ledger.facades import BeatLedger
from opledger.ledger.ids import check_operation_id
from opledger.observability import logs, metrics, tracing
from opledger.settings import UNCONFIGURED_BROKER_URL, Settings, get_settings

from . import backlog, beatwatch, notices
from .config import FollowUps, WorkerConfig, claim_as_configured
from .hooks import HOOKS, Hooks
from .worker import Worker, utcnow

log = logging.getLogger("opledger.tasks")

#: opledger's own Celery app (`opledger worker`, `celery -A opledger.tasks.app`): created
#: here because Celery's `-A` names a module attribute; it configures nothing else
app = Celery("opledger")
app.config_from_object("opledger.celeryconfig")
beatwatch.install(app)  # each worker logs a missing beat once (`tasks.beatwatch`)

_installed = False


@import_modules.connect
def _install_logs_and_traces(**_: Any) -> None:
    """When a worker or beat starts (Celery imports its task modules, before it sets up
    logging): JSON lines when OPLEDGER_LOG_FORMAT=json, and OpenTelemetry in each worker
    process when OTEL_* asks for traces. Importing this module installs nothing."""
    global _installed
    if not _installed:
        _installed = True
        logs.install(get_settings().log_format)
        tracing.install()


#: what this process's worker observes its boundaries with (`use_hooks`)
_hooks: Hooks = HOOKS


def use_hooks(hooks: Hooks) -> None:
    """Observe the worker's boundaries with `hooks` from now on, in this process and the
    pool processes it forks: what `opledger worker` does with the development harness's
    crash points (`cli.devmode`). A production worker keeps `HOOKS`."""
    global _hooks, _runtime
    _hooks = hooks
    _runtime = None


#: why a worker does not start with OPLEDGER_CRASHPOINT set outside development mode
CRASH_POINTS_UNARMED = (
    "OPLEDGER_CRASHPOINT is set, but crash points are development tooling: they are armed "
    "only by `opledger worker` with OPLEDGER_DEV=1; unset OPLEDGER_CRASHPOINT"
)


@celeryd_init.connect
def _refuse_unarmed_crash_points(**_: Any) -> None:
    # crash points are development tooling, armed only through `opledger worker` in
    # development mode: a worker started otherwise with the variable set says so and stops
    if os.environ.get("OPLEDGER_CRASHPOINT") and _hooks is HOOKS:
        raise SystemExit(CRASH_POINTS_UNARMED)


@dataclass
class Runtime:
    """What a worker process needs: the ledger, the adapters, the settings, its hooks; and
    its `Worker`, whose follow-ups publish through the app running the task."""

    settings: Settings
    ledger: Ledger
    registry: Registry
    owner: str
    hooks: Hooks = HOOKS
    _workers: dict[int, Worker] = field(default_factory=dict, repr=False)

    @property
    def beat(self) -> BeatLedger:
        """The ledger as beat's tasks use it: the sweep, the relay and the purge."""
        return self.ledger

    def worker(self, celery_app: Celery) -> Worker:
        """This process's worker, publishing its follow-ups through `celery_app` (the app
        running the task: in a thread or greenlet pool too, where the thread's current app
        is Celery's default)."""
        found = self._workers.get(id(celery_app))
        if found is None:

            def publish(name: str) -> Callable[[str], None]:
                return lambda op_id: celery_app.tasks[name].delay(op_id)

            found = self._workers[id(celery_app)] = Worker(
                self.ledger,
                self.registry,
                owner=self.owner,
                config=WorkerConfig.from_settings(self.settings),
                hooks=self.hooks,
                follow_ups=FollowUps(
                    reconcile=publish("opledger.reconcile"),
                    review_opened=publish("opledger.notify_review"),
                    dispatch=publish("opledger.dispatch"),
                ),
            )
        return found


_runtime: Runtime | None = None

#: how long a worker trusts what it read of the ledger's replication (strict mode)
REPLICATION_TTL_S = 5.0
_replication_read: tuple[float, str | None] = (-REPLICATION_TTL_S, None)


def unreplicated(rt: Runtime) -> str | None:
    """Strict mode (`OPLEDGER_REQUIRE_SYNC_STANDBY`): why nothing may be claimed now (the
    ledger's commits do not wait for an attached synchronous standby, so a failover could
    lose the claim), or None. Read at most every few seconds; off: always None."""
    global _replication_read
    if not rt.settings.require_sync_standby:
        return None
    read_at, why = _replication_read
    if time.monotonic() - read_at >= REPLICATION_TTL_S:
        replication = rt.ledger.replication()
        why = None if replication.durable_on_failover else replication.summary()
        _replication_read = (time.monotonic(), why)
    return why


#: the app that publishes opledger's tasks from code outside a worker: opledger's own, or
#: the one `register(app)` was given
_publisher: Celery = app


def publishing_app() -> Celery:
    """The Celery app opledger publishes through outside a task: the app given to
    `register(app)`, else opledger's own (`OPLEDGER_BROKER_URL`).

    Named explicitly, never Celery's *current* app: that one is per thread, so in any
    thread but the one that created or registered an app (an agent's tool thread, an
    `asyncio.to_thread`, a web server's pool) it is Celery's default app, whose broker is
    `amqp://guest@localhost//` whatever was configured."""
    return _publisher


def use_for_publishing(celery_app: Celery) -> None:
    """Publish through `celery_app` from now on (what `register(app)` does)."""
    global _publisher
    _publisher = celery_app


class BrokerUnavailable(RuntimeError):
    """The broker did not take a message (down, unreachable, refusing the login). The
    operation it was about stays recorded: the beat's relay (a prepared operation) or
    sweeper (an unknown one) publishes it again once the broker answers."""


def publish_dispatch(op_id: str) -> None:
    """Enqueue the dispatch of `op_id` through `publishing_app()`, from any thread.

    Raises `BrokerUnavailable` (one line) when the broker does not take the message; the
    operation is recorded all the same, and the beat's relay publishes it later."""
    _publish("opledger.dispatch", op_id, "the beat's relay publishes it")


def publish_reconcile(op_id: str) -> None:
    """Enqueue a reconcile of `op_id` through `publishing_app()`, from any thread (raises
    `BrokerUnavailable` like `publish_dispatch`; the sweeper hands its check out later)."""
    _publish("opledger.reconcile", op_id, "the beat hands its next check out")


def _publish(task: str, op_id: str, later: str) -> None:
    from kombu.exceptions import OperationalError

    try:
        publishing_app().tasks[task].apply_async((op_id,))
    except (OperationalError, OSError) as exc:
        said = " ".join(str(exc).split()) or type(exc).__name__
        error = BrokerUnavailable(
            f"the broker did not take {task} for {op_id} ({said}): the operation is "
            f"recorded, and {later} once the broker answers"
        )
        # the transport's own frames and chained errors (a hundred lines of kombu and
        # redis-py) say no more than its message, which the error quotes
        exc.__cause__, exc.__suppress_context__ = None, True
        raise error from exc.with_traceback(None)


def runtime() -> Runtime:
    """This process's runtime, built on first use (after any fork).

    It opens the configured ledger and nothing else: with no `OPLEDGER_DATABASE_URL` it
    raises `NotConfigured` rather than find or start a database of its own."""
    global _runtime
    if _runtime is None or _runtime.owner != _owner():
        settings = get_settings()
        registry = load_registry(settings)
        url = settings.require_database_url()
        ledger = Ledger.from_url(
            url,
            actions=registry,
            max_payload_bytes=settings.max_payload_bytes,
            pool_size=2,
            schema=settings.database_schema,
            payload_keys=settings.payload_keys or "",
        )
        claim_as_configured(
            ledger,
            suspect=timedelta(seconds=settings.switch_suspect_seconds),
            synchronous=settings.require_sync_standby,
        )
        _runtime = Runtime(
            settings=settings, ledger=ledger, registry=registry, owner=_owner(), hooks=_hooks
        )
        lease = timedelta(seconds=settings.lease_seconds)
        for action in registry.actions:
            timeout = registry.adapter_for(action).contract.request_timeout
            if timeout >= lease:
                log.warning(
                    "lease (%s) is not longer than %s's request timeout (%s): the sweeper may "
                    "fence out a worker whose call is still running (safe, but wasteful)",
                    lease,
                    action,
                    timeout,
                )
    return _runtime


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@worker_process_init.connect
def _after_fork(**_: Any) -> None:
    # Never share pooled connections across fork: drop whatever the parent had.
    global _runtime
    if _runtime is not None:
        _runtime.ledger.dispose()
        _runtime = None


_generations: backlog.Generations | None = None


def generations(celery_app: Celery | None = None) -> backlog.Generations:
    """This process's store of the latest published message generations."""
    global _generations
    if _generations is None:
        ttl = 2 * int(get_settings().visibility_timeout_seconds)  # outlives any redelivery
        broker = (celery_app or app).conf.broker_url
        _generations = backlog.Generations(broker, ttl_s=ttl)
    return _generations


@before_task_publish.connect
def _stamp_sent(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    # When a dispatch or reconcile message was published: only an old enough message can
    # have been superseded, so only those are checked against the latest generation.
    if headers is not None and sender in ("opledger.dispatch", "opledger.reconcile"):
        headers.setdefault(backlog.SENT_HEADER, time.time())


def _superseded(task: Any, kind: str, op_id: str, gen: int, min_age: float) -> bool:
    """A duplicate a newer publish made redundant: dropped before any database work."""
    age = backlog.message_age(task.request.headers)
    if age is None or age < min_age:
        return False
    if not generations(task.app).superseded(kind, op_id, gen):
        return False
    log.info("%s of %s: generation %d superseded by a newer message; dropped", kind, op_id, gen)
    return True


def queue_of(task_name: str, celery_app: Celery | None = None) -> str:
    """The queue a task is routed to (celeryconfig.task_routes)."""
    conf = (celery_app or app).conf
    routes = conf.task_routes or {}
    # a dict, or a list of routers (`opledger.tasks.register` puts ours first)
    for router in [routes] if isinstance(routes, dict) else routes:
        if isinstance(router, dict) and task_name in router:
            return str(router[task_name].get("queue", conf.task_default_queue))
    return str(conf.task_default_queue)


#: an operation a task can never act on: logged and dropped, never retried
REFUSED = (MalformedOperationId, OperationNotFound, UnknownAction)


class OperationTask(Task):  # type: ignore[misc]
    """The base of opledger's tasks.

    - `DatabaseUnavailable` (connection lost, Postgres restarting, serialization failure)
      is retried by Celery with exponential backoff (1 s doubling, at most 30 s between
      tries, far below the visibility timeout), 8 times; any other error fails the task.
    - An operation id that is malformed, unknown or names an action no adapter serves is
      refused (`refusing`): logged once and dropped, since no retry can fix it.
    """

    ignore_result = True  # on an app of yours with a result backend too
    autoretry_for = (DatabaseUnavailable,)
    retry_backoff = 1
    retry_backoff_max = 30
    retry_jitter = True
    max_retries = 8

    def apply_async(self, *args: Any, **kwargs: Any) -> Any:
        """Publish, unless no broker was configured (never a silent local default)."""
        if self.app.conf.broker_url == UNCONFIGURED_BROKER_URL:
            get_settings().require_broker_url()  # raises NotConfigured, naming the variable
        return super().apply_async(*args, **kwargs)


def _sibling(task: Task, name: str) -> Task:
    """Another of opledger's tasks on the app running `task` (in a thread or greenlet
    pool too, where the thread's current app is Celery's default)."""
    return task.app.tasks[name]


F = TypeVar("F", bound=Callable[..., Any])


def refusing(fn: F) -> F:
    """Refuse what no retry can fix (`REFUSED`): log it once and return "refused".

    A wrapper of the task's function rather than an override of `Task.__call__`, which
    would put every task on Celery's slower tracing path."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except REFUSED as exc:
            task = args[0] if args and isinstance(args[0], Task) else None
            op_id = args[1:2] if task is not None else args[:1]
            log.error("%s refused for %r: %s", task.name if task else fn.__name__, op_id, exc)
            return "refused"

    # Celery checks a call's arguments at publish time against the function's signature
    # (`inspect.getfullargspec`, which does not follow `__wrapped__`): give it the real one
    run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return cast(F, run)


@shared_task(name="opledger.dispatch", base=OperationTask, bind=True)
@refusing
def dispatch(self: OperationTask, op_id: str, gen: int = 0) -> str:
    """Claim a prepared operation under a fence and send it. A no-op when redelivered.

    `gen` is the relay's publish generation (0: the first publish); a message older than
    the relay's wait whose generation a newer publish superseded is dropped unread."""
    check_operation_id(op_id)
    settings = get_settings()
    if _superseded(self, "dispatch", op_id, int(gen), settings.relay_after_seconds):
        return "superseded"
    rt = runtime()
    held = unreplicated(rt)
    if held is not None:
        rt.ledger.defer(op_id, until=utcnow() + timedelta(seconds=settings.sweep_interval_seconds))
        log.warning("%s not claimed (OPLEDGER_REQUIRE_SYNC_STANDBY): %s", op_id, held)
        return "held"
    return rt.worker(self.app).dispatch(op_id).action


@shared_task(name="opledger.reconcile", base=OperationTask, bind=True)
@refusing
def reconcile(self: OperationTask, op_id: str, gen: int = 0) -> str:
    """Run the retry decision on an unknown operation and act on it.

    `gen` numbers the sweep's hand-out of this check; a message older than the check
    backoff whose check was handed out again since is dropped unread."""
    check_operation_id(op_id)
    settings = get_settings()
    if gen and _superseded(self, "check", op_id, int(gen), settings.check_backoff_seconds):
        return "superseded"
    rt = runtime()
    held = unreplicated(rt)
    if held is not None:  # checked again when the sweep hands it out next
        log.warning("%s not reconciled (OPLEDGER_REQUIRE_SYNC_STANDBY): %s", op_id, held)
        return "held"
    return rt.worker(self.app).reconcile(op_id).action


@shared_task(name="opledger.sweep", base=OperationTask, bind=True)
def sweep(self: OperationTask) -> dict[str, int]:
    """Fence out expired leases and hand due checks to reconcile.

    Expired leases become checks due at once; the checks are handed out only into the
    reconcile queue's headroom (the backlog guard), so a check never waits there long
    enough to fall due a second time."""
    started = time.perf_counter()
    rt = runtime()
    # a failover or a restore is noticed here even when no claim or outcome is being
    # written: the switch is recorded, and every open operation quarantined, before the
    # sweep moves anything
    lease = timedelta(seconds=rt.settings.lease_seconds)
    # each of its transactions bounded by the interval: a frozen sweep holds nothing longer
    interval = timedelta(seconds=rt.settings.sweep_interval_seconds)
    rt.beat.check_switch(by=rt.owner, terms=rt.registry.claim_terms(lease), interval=interval)
    backoff = timedelta(seconds=rt.settings.check_backoff_seconds)
    expired = rt.beat.expire_leases(
        limit=rt.settings.sweep_batch, backoff=timedelta(0), interval=interval
    )
    queue = queue_of("opledger.reconcile", self.app)
    handouts = rt.beat.hand_out_checks(
        limit=rt.settings.sweep_batch,
        backoff=backoff,
        depth=backlog.queue_depth(self.app, queue),
        interval=interval,
        queue=queue,
    )
    reconcile_task = _sibling(self, "opledger.reconcile")
    for handout in handouts:
        reconcile_task.apply_async((handout.op_id,), {"gen": handout.gen})
    generations(self.app).published("check", list(handouts))
    notify = _hand_out_notifications(self, rt, backoff, interval)
    metrics.SWEEP_DURATION.observe(time.perf_counter() - started)
    if expired or handouts:
        log.info("sweep: %d leases expired, %d checks handed out", len(expired), len(handouts))
    return {"expired": len(expired), "due": len(handouts), **notify}


def _hand_out_notifications(
    task: OperationTask, rt: Runtime, backoff: timedelta, interval: timedelta
) -> dict[str, int]:
    """Publish the notification tasks of the reviews and the approval requests not yet
    notified (each handed out once per backoff until its notification is prepared)."""
    limit = rt.settings.sweep_batch
    reviews = rt.beat.due_notifications(limit=limit, backoff=backoff, interval=interval)
    for op_id in reviews:
        _sibling(task, "opledger.notify_review").delay(op_id)
    approvals = rt.beat.due_approval_notifications(limit=limit, backoff=backoff, interval=interval)
    for op_id in approvals:
        _sibling(task, "opledger.notify_approval").delay(op_id)
    return {"notify": len(reviews), "notify_approvals": len(approvals)}


@shared_task(name="opledger.notify_review", base=OperationTask, bind=True)
@refusing
def notify_review(self: OperationTask, op_id: str) -> str:
    """Tell the configured webhook that `op_id`'s review is waiting (`Worker.notify_review`:
    the notification is an operation of its own, one per review, so a crash or a
    redelivery here can never send it twice)."""
    check_operation_id(op_id)
    # this task's span, when traces are on: the notification's trace links back to it
    return runtime().worker(self.app).notify_review(op_id, traceparent=tracing.traceparent())


@shared_task(name="opledger.notify_approval", base=OperationTask, bind=True)
@refusing
def notify_approval(self: OperationTask, op_id: str) -> str:
    """Tell the configured webhook that `op_id`'s act waits for a person's approval
    (`notices.notify_approval`: the notification is an operation of its own, one per
    approval request, so a crash or a redelivery here can never send it twice). Sent where
    review notifications go; the approval itself is never taken from a webhook."""
    check_operation_id(op_id)
    rt = runtime()
    return notices.notify_approval(
        rt.ledger,
        op_id,
        webhook_url=rt.settings.review_webhook_url or None,
        dispatch=_sibling(self, "opledger.dispatch").delay,
        traceparent=tracing.traceparent(),
    )


@shared_task(name="opledger.relay", base=OperationTask, bind=True)
def relay(self: OperationTask) -> int:
    """Publish again the prepared operations whose message is plausibly lost.

    Each one at most once per backoff (doubling), never while the dispatch queue is deeper
    than the workers drain in two intervals (the backlog guard), and each message carries
    its generation so a superseded one is dropped by the worker."""
    rt = runtime()
    queue = queue_of("opledger.dispatch", self.app)
    published: list[tuple[str, int]] = []

    dispatch_task = _sibling(self, "opledger.dispatch")

    def publish(op_id: str, gen: int) -> None:
        dispatch_task.apply_async((op_id,), {"gen": gen})
        published.append((op_id, gen))

    ids = rt.beat.relay(
        older_than=timedelta(seconds=rt.settings.relay_after_seconds),
        publish=publish,
        limit=rt.settings.sweep_batch,
        before_mark=rt.hooks.relayed,
        depth=backlog.queue_depth(self.app, queue),
        interval=timedelta(seconds=rt.settings.sweep_interval_seconds),
        queue=queue,
    )
    generations(self.app).published("dispatch", published)
    if ids:
        metrics.RELAY_REPUBLISHED.inc(len(ids))
        log.info("relay: re-published %d prepared operations", len(ids))
    return len(ids)


@shared_task(name="opledger.purge_payloads", base=OperationTask)
def purge_payloads() -> int:
    """Delete frozen payloads of finished operations past the retention setting."""
    rt = runtime()
    return rt.beat.purge_payloads(
        older_than=timedelta(days=rt.settings.payload_retention_days),
        limit=rt.settings.sweep_batch,
    )
