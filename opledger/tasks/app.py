"""The Celery app and opledger's tasks.

Every task's only argument is an operation id (beat tasks take none): no payload and no
customer data ever travels through the broker or shows in Flower. Agents call
``dispatch.delay(op_id)`` after `Ledger.prepare`.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from sqlalchemy.exc import DBAPIError

from opledger import devstack
from opledger.adapters.registry import Registry, load_registry
from opledger.ledger import Ledger, MalformedOperationId, OperationNotFound, UnknownAction
from opledger.ledger.ids import check_operation_id
from opledger.settings import Settings, get_settings

from . import crashpoints, steps

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
        url = settings.database_url or devstack.ledger_database_url()
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


def _retry_on_database_error(task: Any, exc: DBAPIError) -> Any:
    countdown = min(2**task.request.retries, 30)  # far below the visibility timeout
    log.warning("database unavailable (%s); retrying in %ss", type(exc.orig).__name__, countdown)
    return task.retry(exc=exc, countdown=countdown, max_retries=8)


@app.task(name="opledger.dispatch", bind=True)
def dispatch(self: Any, op_id: str) -> str:
    """Claim a prepared operation under a fence and send it. A no-op when redelivered."""
    try:
        check_operation_id(op_id)
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
def reconcile(self: Any, op_id: str) -> str:
    """Run the retry decision on an unknown operation and act on it."""
    try:
        check_operation_id(op_id)
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
    """Fence out expired leases and hand due checks to reconcile."""
    rt = runtime()
    backoff = timedelta(seconds=rt.settings.check_backoff_seconds)
    expired = rt.ledger.expire_leases(limit=rt.settings.sweep_batch, backoff=backoff)
    due = rt.ledger.due_checks(limit=rt.settings.sweep_batch, backoff=backoff)
    for op_id in (*expired, *due):
        reconcile.delay(op_id)
    unnotified = rt.ledger.due_notifications(limit=rt.settings.sweep_batch, backoff=backoff)
    for op_id in unnotified:
        notify_review.delay(op_id)
    if expired or due:
        log.info("sweep: %d leases expired, %d checks due", len(expired), len(due))
    return {"expired": len(expired), "due": len(due), "notify": len(unnotified)}


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
    """Publish again the prepared operations whose message never arrived."""
    rt = runtime()

    def publish(op_id: str) -> None:
        dispatch.delay(op_id)

    ids = rt.ledger.relay(
        older_than=timedelta(seconds=rt.settings.relay_after_seconds),
        publish=publish,
        limit=rt.settings.sweep_batch,
        before_mark=lambda: crashpoints.reached("relay.after_publish"),
    )
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
