"""The outbox: prepare inside the caller's transaction, enqueue only after it commits.

    with Session(engine) as session:
        session.add(business_change)
        prepare_and_dispatch(ledger, session=session, tenant=..., ...)
        session.commit()          # the dispatch message is published here, not before

If the process dies between the commit and the publish, the beat `relay` finds the
prepared operation and publishes it again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from opledger.ledger import Ledger, Operation

_PENDING = "opledger.pending_dispatch"


def _publish(session: Session) -> None:
    from .app import dispatch

    pending = session.info.pop(_PENDING, [])
    for op_id in pending:
        dispatch.delay(op_id)


def _forget(session: Session, *_: Any) -> None:
    session.info.pop(_PENDING, None)


def prepare_and_dispatch(
    ledger: Ledger, *, session: Session | None = None, **intent: Any
) -> Operation:
    """`Ledger.prepare(**intent)`, then `dispatch.delay(op.id)`: at once without a session,
    after the session's commit with one (nothing is published if it rolls back)."""
    op = ledger.prepare(session=session, **intent)
    if session is None:
        from .app import dispatch

        dispatch.delay(op.id)
        return op
    if _PENDING not in session.info:
        session.info[_PENDING] = []
        if not event.contains(session, "after_commit", _publish):
            event.listen(session, "after_commit", _publish)
            event.listen(session, "after_rollback", _forget)
    if op.id not in session.info[_PENDING]:
        session.info[_PENDING].append(op.id)
    return op
