"""The outbox: prepare inside the caller's transaction, enqueue only after it commits.

    with Session(engine) as session:
        session.add(business_change)
        prepare_and_dispatch(ledger, session=session, tenant=..., ...)
        session.commit()          # the dispatch message is published here, not before

If the process dies between the commit and the publish, or the broker is down then, the
beat `relay` finds the prepared operation and publishes it later: the helper never raises
from the caller's commit, it logs the failed publish.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from opledger.ledger import Ledger, Operation
from opledger.observability import tracing

_PENDING = "opledger.pending_dispatch"
log = logging.getLogger("opledger.outbox")


def _publish(session: Session) -> None:
    for op_id in session.info.pop(_PENDING, []):
        _try_publish(op_id)


def _try_publish(op_id: str) -> None:
    """Publish the dispatch message, best effort: the operation is committed already, so a
    broker outage must not fail the caller (the beat relay publishes it later)."""
    from .app import publish_dispatch

    try:
        publish_dispatch(op_id)
    except Exception as exc:  # kombu/redis/amqp errors differ by transport
        log.warning(
            "%s is prepared but its dispatch message could not be published (%s: %s); "
            "the relay will publish it",
            op_id,
            type(exc).__name__,
            exc,
        )


def _forget(session: Session, *_: Any) -> None:
    session.info.pop(_PENDING, None)


def prepare_and_dispatch(
    ledger: Ledger, *, session: Session | None = None, **intent: Any
) -> Operation:
    """`Ledger.prepare(**intent)`, then `publish_dispatch(op.id)`: at once without a session,
    after the session's commit with one (nothing is published if it rolls back).

    Traced as `opledger.prepare` (its context kept on the operation); with a session, the
    publish runs at commit, outside that span, and the worker's spans link back to it."""
    given = intent.pop("traceparent", None)  # the caller's own trace context wins
    with tracing.prepare(str(intent.get("tenant")), str(intent.get("action"))) as span:
        op = ledger.prepare(session=session, traceparent=given or span.traceparent(), **intent)
        span.prepared(op)
        if session is None:
            _try_publish(op.id)
            return op
    if _PENDING not in session.info:
        session.info[_PENDING] = []
        if not event.contains(session, "after_commit", _publish):
            event.listen(session, "after_commit", _publish)
            event.listen(session, "after_rollback", _forget)
    if op.id not in session.info[_PENDING]:
        session.info[_PENDING].append(op.id)
    return op
