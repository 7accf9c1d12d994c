"""The Celery app and opledger's tasks.

Every task's only argument is an operation id (beat tasks take none): no payload and no
customer data ever travels through the broker or shows in Flower. Agents call
``dispatch.delay(op_id)`` after `Ledger.prepare`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.signals import before_task_publish, worker_process_init
from sqlalchemy.exc import DBAPIError

from opledger.adapters.registry import Registry, load_registry
from opledger.ledger import Ledger, MalformedOperationId, OperationNotFound, UnknownAction
from opledger.ledger.ids import check_operation_id
from opledger.settings import Settings, get_settings

from . import backlog, crashpoints, steps

log = logging.getLogger("opledger.tasks")

app = Celery("opledger")
app.config_from_object("opledger.celeryconfig")


@dataclass
class Runtime:
    """What a worker process needs: the ledger, the adapters and the settings."""

    settings: Settings
    ledger: Ledger
    registry: Registry
    owner: str

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.settings.lease_seconds)


_runtime: Runtime | None = None


def runtime() -> Runtime:
    """This process's runtime, built on first use (after any fork)."""
    global _runtime
    if _runtime is None or _runtime.owner != _owner():
        settings = get_settings()
        registry = load_registry(settings)
        url = settings.require_database_url()
        ledger = Ledger.from_url(
            url, actions=registry, max_payload_bytes=settings.max_payload_bytes, pool_size=2
        )
        _runtime = Runtime(settings=settings, ledger=ledger, registry=registry, owner=_owner())
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


def generations() -> backlog.Generations:
    """This process's store of the latest published message generations."""
    global _generations
    if _generations is None:
        ttl = 2 * int(get_settings().visibility_timeout_seconds)  # outlives any redelivery
        _generations = backlog.Generations(app.conf.broker_url, ttl_s=ttl)
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
    if not generations().superseded(kind, op_id, gen):
        return False
    log.info("%s of %s: generation %d superseded by a newer message; dropped", kind, op_id, gen)
    return True


def queue_of(task_name: str) -> str:
    """The queue a task is routed to (celeryconfig.task_routes)."""
    route = (app.conf.task_routes or {}).get(task_name, {})
    return str(route.get("queue", app.conf.task_default_queue))


def _retry_on_database_error(task: Any, exc: DBAPIError) -> Any:
    countdown = min(2**task.request.retries, 30)  # far below the visibility timeout
    log.warning("database unavailable (%s); retrying in %ss", type(exc.orig).__name__, countdown)
    return task.retry(exc=exc, countdown=countdown, max_retries=8)


@app.task(name="opledger.dispatch", bind=True)
def dispatch(self: Any, op_id: str, gen: int = 0) -> str:
    """Claim a prepared operation under a fence and send it. A no-op when redelivered.

    `gen` is the relay's publish generation (0: the first publish); a message older than
    the relay's wait whose generation a newer publish superseded is dropped unread."""
    try:
        check_operation_id(op_id)
        settings = get_settings()
        if _superseded(self, "dispatch", op_id, int(gen), settings.relay_after_seconds):
            return "superseded"
        rt = runtime()
        return steps.dispatch(
            rt.ledger, rt.registry, op_id, owner=rt.owner, lease=rt.lease, settle=reconcile.delay
        ).action
    except (MalformedOperationId, OperationNotFound, UnknownAction) as exc:
        log.error("dispatch refused for %r: %s", op_id, exc)
        return "refused"
    except DBAPIError as exc:
        raise _retry_on_database_error(self, exc) from exc


@app.task(name="opledger.reconcile", bind=True)
def reconcile(self: Any, op_id: str, gen: int = 0) -> str:
    """Run the retry decision on an unknown operation and act on it.

    `gen` numbers the sweep's hand-out of this check; a message older than the check
    backoff whose check was handed out again since is dropped unread."""
    try:
        check_operation_id(op_id)
        settings = get_settings()
        if gen and _superseded(self, "check", op_id, int(gen), settings.check_backoff_seconds):
            return "superseded"
        rt = runtime()
        policy = steps.ReviewPolicy(
            after_attempts=rt.settings.review_after_attempts,
            after=timedelta(seconds=rt.settings.review_after_seconds),
        )
        return steps.reconcile(
            rt.ledger,
            rt.registry,
            op_id,
            owner=rt.owner,
            lease=rt.lease,
            policy=policy,
            on_review=notify_review.delay,
            settle=reconcile.delay,
        ).action
    except (MalformedOperationId, OperationNotFound, UnknownAction) as exc:
        log.error("reconcile refused for %r: %s", op_id, exc)
        return "refused"
    except DBAPIError as exc:
        raise _retry_on_database_error(self, exc) from exc


@app.task(name="opledger.sweep")
def sweep() -> dict[str, int]:
    """Fence out expired leases and hand due checks to reconcile.

    Expired leases become checks due at once; the checks are handed out only into the
    reconcile queue's headroom (the backlog guard), so a check never waits there long
    enough to fall due a second time."""
    rt = runtime()
    backoff = timedelta(seconds=rt.settings.check_backoff_seconds)
    expired = rt.ledger.expire_leases(limit=rt.settings.sweep_batch, backoff=timedelta(0))
    queue = queue_of("opledger.reconcile")
    handouts = rt.ledger.hand_out_checks(
        limit=rt.settings.sweep_batch,
        backoff=backoff,
        depth=backlog.queue_depth(app, queue),
        interval=timedelta(seconds=rt.settings.sweep_interval_seconds),
        queue=queue,
    )
    for handout in handouts:
        reconcile.apply_async((handout.op_id,), {"gen": handout.gen})
    generations().published("check", list(handouts))
    unnotified = rt.ledger.due_notifications(limit=rt.settings.sweep_batch, backoff=backoff)
    for op_id in unnotified:
        notify_review.delay(op_id)
    if expired or handouts:
        log.info("sweep: %d leases expired, %d checks handed out", len(expired), len(handouts))
    return {"expired": len(expired), "due": len(handouts), "notify": len(unnotified)}


NOTIFY_ACTION = "webhook.post.v1"


@app.task(name="opledger.notify_review", bind=True)
def notify_review(self: Any, op_id: str) -> str:
    """Tell the configured webhook that `op_id`'s review is waiting.

    The notification is an operation of its own, one per review (its intent key is the
    review id), so a crash or a redelivery here can never send it twice.
    """
    try:
        check_operation_id(op_id)
        rt = runtime()
        history = rt.ledger.history(op_id)
        review = next((r for r in reversed(history.reviews) if r.resolved_at is None), None)
        if review is None:
            return "noop"
        op = history.operation
        if not rt.settings.review_webhook_url or op.action.startswith("webhook."):
            rt.ledger.mark_notified(review.id)  # nothing to send (or a notification's own review)
            return "skipped"
        grant = rt.ledger.grant(
            tenant=op.tenant,
            scope=["webhook.*"],
            granted_by="opledger",
            ref=f"opledger-notify-{op.tenant}",
        )
        note = rt.ledger.prepare(
            tenant=op.tenant,
            workflow_id=f"review:{op.id}",
            intent_key=f"review-opened:{review.id}",
            action=NOTIFY_ACTION,
            target="review-webhook",
            payload={
                "event": "review.opened",
                "review_id": review.id,
                "op_id": op.id,
                "tenant": op.tenant,
                "action": op.action,
                "target": op.target,
                "reason": review.reason,
                "opened_at": review.opened_at.isoformat(),
            },
            authorization_ref=grant.ref,
            actor="notify_review",
        )
        rt.ledger.mark_notified(review.id)
        dispatch.delay(note.id)
        return "prepared"
    except (MalformedOperationId, OperationNotFound, UnknownAction) as exc:
        log.error("notify_review refused for %r: %s", op_id, exc)
        return "refused"
    except DBAPIError as exc:
        raise _retry_on_database_error(self, exc) from exc


@app.task(name="opledger.relay")
def relay() -> int:
    """Publish again the prepared operations whose message is plausibly lost.

    Each one at most once per backoff (doubling), never while the dispatch queue is deeper
    than the workers drain in two intervals (the backlog guard), and each message carries
    its generation so a superseded one is dropped by the worker."""
    rt = runtime()
    queue = queue_of("opledger.dispatch")
    published: list[tuple[str, int]] = []

    def publish(op_id: str, gen: int) -> None:
        dispatch.apply_async((op_id,), {"gen": gen})
        published.append((op_id, gen))

    ids = rt.ledger.relay(
        older_than=timedelta(seconds=rt.settings.relay_after_seconds),
        publish=publish,
        limit=rt.settings.sweep_batch,
        before_mark=lambda: crashpoints.reached("relay.after_publish"),
        depth=backlog.queue_depth(app, queue),
        interval=timedelta(seconds=rt.settings.sweep_interval_seconds),
        queue=queue,
    )
    generations().published("dispatch", published)
    if ids:
        log.info("relay: re-published %d prepared operations", len(ids))
    return len(ids)


@app.task(name="opledger.purge_payloads")
def purge_payloads() -> int:
    """Delete frozen payloads of finished operations past the retention setting."""
    rt = runtime()
    return rt.ledger.purge_payloads(
        older_than=timedelta(days=rt.settings.payload_retention_days),
        limit=rt.settings.sweep_batch,
    )
