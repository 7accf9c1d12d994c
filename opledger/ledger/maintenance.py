"""Maintenance, for beat: expired leases (and approvals), due checks, the relay and its
backlog guard, payload purges and review and approval notifications; and, for an operator,
payload key rotation.

No lock is held across a stall. Every maintenance transaction is bounded (`Bounds`, set by
its first statement, `SET LOCAL` through `set_config(..., true)`): it waits for a lock at
most half its bound (`lock_timeout`), and when it sits idle between two statements longer
than its bound (its process stopped, a paused VM, a long GC) the server ends its session
(`idle_in_transaction_session_timeout`), which rolls back what it did and releases its
locks. The bound is the interval of its cycle (the sweep interval; at least a second), so
a frozen process costs the others at most one cycle. Nothing waits for a row another
maintenance transaction holds: rows are taken `FOR UPDATE SKIP LOCKED`, and a backlog
guard another run holds is skipped for this cycle (logged at debug): that run is
publishing into the queue (or is frozen, and its transaction ends at its bound).

A process that resumes after its transaction was ended changed nothing: its next statement
or its commit fails (25P03; or the connection reads as closed, when it was stopped waiting
for a result; 55P03 for a lock waited for too long), and the run returns what it does when
there is nothing to do, with a warning: it lost the cycle, the next one does the work (no
error, so no task retry). The messages a frozen relay published before its stall are published again
later, which the fenced claim makes harmless.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, TextClause
from sqlalchemy.exc import DBAPIError

from . import backlog, store
from . import queries as q
from .backlog import RELAY_MAX_DOUBLINGS, Handout
from .base import LedgerBase
from .bounds import Bounds, lost_cycle
from .errors import DatabaseUnavailable, InvalidInput
from .payload_keys import (
    KEYS_VARIABLE,
    PayloadKeys,
    PayloadKeysMissing,
    open_result,
    payload_text,
    seal_result,
    sealed_columns,
)
from .queries.maintenance import BOUND_TRANSACTION

log = logging.getLogger("opledger.ledger")

T = TypeVar("T")


@dataclass(frozen=True)
class Rotation:
    """What `rotate_payloads` did: rows sealed anew under `key_id`, and rows still not
    under it (held by another transaction while it ran: run it again)."""

    key_id: str
    resealed: int
    remaining: int


class Maintenance(LedgerBase):
    """What beat's sweep, relay and purge ask of the ledger: batches, `FOR UPDATE SKIP
    LOCKED`, safe to run twice, each a bounded transaction (the module says how)."""

    @contextmanager
    def _bounded(self, interval: timedelta | None) -> Iterator[Connection]:
        """A maintenance transaction, bounded by `Bounds.of(interval)`."""
        with self._tx() as conn:
            conn.execute(BOUND_TRANSACTION, Bounds.of(interval).params())
            yield conn

    def _cycle(
        self,
        what: str,
        interval: timedelta | None,
        body: Callable[[Connection], T],
        lost: T,
    ) -> T:
        """`body` in a bounded transaction; `lost` when the server ended it (`lost_cycle`):
        nothing of it was kept, and the next cycle does the work."""
        bounds = Bounds.of(interval)
        started = time.monotonic()
        try:
            with self._bounded(interval) as conn:
                return body(conn)
        except (DBAPIError, DatabaseUnavailable) as exc:
            took = timedelta(seconds=time.monotonic() - started)
            why = lost_cycle(exc, took=took, bounds=bounds)
            if why is None:
                raise
            log.warning(
                "%s lost its cycle: its transaction %s (its bounds: a lock waited for %.1f s, "
                "idle %.1f s), and the database ended it; nothing of it was kept",
                what,
                why,
                bounds.lock.total_seconds(),
                bounds.idle.total_seconds(),
            )
            return lost

    def expire_leases(
        self,
        *,
        limit: int = 500,
        backoff: timedelta = timedelta(0),
        actor: str = "sweeper",
        interval: timedelta | None = None,
    ) -> list[str]:
        """Fence out claims whose lease expired: dispatching -> unknown, fence + 1.

        The stalled or dead worker can no longer write; the operations are due for
        reconciliation after `backoff`. Safe to run from two sweepers at once. `interval`:
        the sweep's, which bounds its transaction. In the same transaction, approvals past
        their time expire and their operations are cancelled (`expire_approvals`), so the
        sweep that expires leases expires them too; only the leases' ids are returned (an
        expired approval has nothing to reconcile).
        """

        def expire(conn: Connection) -> list[str]:
            params = {"limit": limit, "backoff": backoff, "actor": actor}
            expired = [r.id for r in conn.execute(q.EXPIRE_LEASES, params)]
            _expire_approvals(conn, limit, actor)
            return expired

        return self._cycle("the lease expiry", interval, expire, [])

    def expire_approvals(
        self, *, limit: int = 500, actor: str = "sweeper", interval: timedelta | None = None
    ) -> list[str]:
        """Expire pending approvals past their `expires_at` and cancel their operations
        ("approval expired: ..."): the ids expired. Safe to run from two sweepers at once;
        `expire_leases` runs it in its own transaction, every sweep."""
        return self._cycle(
            "the approval expiry", interval, lambda c: _expire_approvals(c, limit, actor), []
        )

    def due_checks(self, *, limit: int = 500, backoff: timedelta) -> list[str]:
        """Unknown operations whose check is due; each is pushed `backoff` into the future
        so it is handed out once per backoff, even when its reconcile message is lost."""
        return [h.op_id for h in self.hand_out_checks(limit=limit, backoff=backoff)]

    def hand_out_checks(
        self,
        *,
        limit: int = 500,
        backoff: timedelta,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = "reconcile",
    ) -> list[Handout]:
        """Due checks to hand to reconcile, each numbered (its `check_gen`).

        With `interval` (the sweep's) the backlog guard applies: `depth` is the reconcile
        queue's depth now, and checks are handed out only until the queue holds what the
        workers drain in two intervals, so a check does not wait in the queue long enough
        to fall due again: at most one outstanding check per operation.
        """

        def hand_out(conn: Connection) -> list[Handout]:
            allowed = limit
            budget = None
            if interval is not None:
                budget = self._guard(conn, queue, depth=depth, interval=interval, limit=limit)
                if budget is None:
                    return []
                allowed = budget.allowed
            rows: Sequence[Any] = []
            if allowed:
                rows = conn.execute(q.DUE_CHECKS, {"limit": allowed, "backoff": backoff}).all()
            if budget is not None:
                self._save_guard(conn, queue, budget.state, published=len(rows))
            return [Handout(r.id, r.check_gen) for r in rows]

        return self._cycle("the hand-out of due checks", interval, hand_out, [])

    def relay(
        self,
        *,
        older_than: timedelta,
        publish: Callable[[str, int], None],
        limit: int = 500,
        before_mark: Callable[[], None] | None = None,
        depth: int | None = None,
        interval: timedelta | None = None,
        queue: str = "dispatch",
        max_doublings: int = RELAY_MAX_DOUBLINGS,
    ) -> list[str]:
        """Publish again the prepared operations whose message is plausibly lost.

        An operation qualifies when nobody claimed it for `older_than` since its last
        publish; every re-publication doubles that wait (up to 2^`max_doublings`), and
        `publish(op_id, generation)` gets the new generation to carry in the message.

        With `interval` (the relay's) the backlog guard applies: `depth` is the dispatch
        queue's depth now; nothing is published while the queue is deeper than the workers
        drain in two intervals, nor until it has been that shallow for `older_than` (a
        message queued behind a backlog had that long to arrive), and then only into the
        headroom. In one transaction: lock a batch (SKIP LOCKED), publish each, then mark
        them. A crash between publishing and marking only publishes them again later,
        which the fenced claim makes harmless; so does a stall past the transaction's bound
        (the relay then returns [], having marked nothing). A guard another relay holds
        is skipped: nothing is published this cycle.
        """

        def relay(conn: Connection) -> list[str]:
            budget = None
            allowed = limit
            if interval is not None:
                counter = int(conn.execute(q.CLAIM_COUNTER).scalar_one())
                budget = self._guard(
                    conn,
                    queue,
                    depth=depth,
                    interval=interval,
                    limit=limit,
                    hold_for=older_than,
                    counter=counter,
                )
                if budget is None:
                    return []
                allowed = budget.allowed
            rows: Sequence[Any] = []
            if allowed:
                rows = conn.execute(
                    q.RELAY_CANDIDATES,
                    {"after": older_than, "limit": allowed, "max_doublings": max_doublings},
                ).all()
            for r in rows:
                publish(r.id, r.relay_gen + 1)
            if rows and before_mark is not None:
                before_mark()
            ids = [r.id for r in rows]
            if ids:
                conn.execute(q.MARK_ENQUEUED, {"ids": ids})
            if budget is not None:
                self._save_guard(conn, queue, budget.state, published=len(ids))
            return ids

        return self._cycle("the relay", interval, relay, [])

    def _guard(
        self,
        conn: Connection,
        queue: str,
        *,
        depth: int | None,
        interval: timedelta,
        limit: int,
        hold_for: timedelta = timedelta(0),
        counter: int | None = None,
    ) -> backlog.Plan | None:
        """The guard's plan for this run, its row locked until the transaction ends; None
        when another run holds it (skipped, not waited for: it is that run's cycle)."""
        row = conn.execute(q.LOCK_QUEUE_GUARD, {"queue": queue}).one_or_none()
        if row is None:
            if conn.execute(q.ENSURE_QUEUE_GUARD, {"queue": queue}).one_or_none() is None:
                log.debug("the backlog guard of %s is held by another run: skipped", queue)
                return None
            row = conn.execute(q.LOCK_QUEUE_GUARD, {"queue": queue}).one()  # ours, new
        return backlog.plan(
            _guard_state(row),
            depth=depth,
            now=row.now,
            counter=counter,
            interval=interval,
            limit=limit,
            hold_for=hold_for,
        )

    def _save_guard(
        self, conn: Connection, queue: str, state: backlog.GuardState, *, published: int
    ) -> None:
        after = None if state.depth_after is None else state.depth_after + published
        conn.execute(
            q.SAVE_QUEUE_GUARD,
            {
                "queue": queue,
                "sampled_at": state.sampled_at,
                "depth_after": after,
                "counter": state.counter,
                "drain_per_s": state.drain_per_s,
                "shallow_since": state.shallow_since,
            },
        )

    def queue_guard(self, queue: str) -> backlog.GuardState | None:
        """The backlog guard's last sample of `queue` (None before the first guarded run)."""
        with self._single() as conn:
            row = conn.execute(q.SELECT_QUEUE_GUARD, {"queue": queue}).one_or_none()
        return None if row is None else _guard_state(row)

    def purge_payloads(
        self, *, older_than: timedelta, limit: int = 1000, interval: timedelta | None = None
    ) -> int:
        """Delete frozen payloads of finished operations older than `older_than`.

        The digest, the attempts and the evidence stay. `interval` bounds its transaction.
        """

        def purge(conn: Connection) -> int:
            params = {"older_than": older_than, "limit": limit}
            return len(conn.execute(q.PURGE_PAYLOADS, params).all())

        return self._cycle("the payload purge", interval, purge, 0)

    def rotate_payloads(
        self, *, batch: int = 500, progress: Callable[[int], None] | None = None
    ) -> Rotation:
        """Seal every frozen payload not yet under the current key (the first of the
        configured keys): those under older keys and those in clear.

        A batch at a time, each one short bounded transaction: lock up to `batch` rows (`FOR
        UPDATE SKIP LOCKED`, in id order), decrypt each with the key it names, seal it under
        the current key, commit; `progress(n)` hears each batch's count. A batch the
        database ended (this process stalled past its bound) ends that pass, its rows
        left for a later run and counted in `remaining`. Safe while workers
        run (a claim reads the row as last committed, under a key still configured) and
        safe to run twice (a second run finds nothing to do). Rows another transaction
        holds are left for a later run and counted in `remaining`. Raises
        `PayloadKeysMissing` without keys, and `PayloadKeyUnknown` on a row under a key id
        no longer configured (nothing of that batch is written).
        """
        keys = self._store.payload_keys
        if keys is None:
            raise PayloadKeysMissing(
                f"{KEYS_VARIABLE} is not set: there is no key to encrypt the payloads with"
            )
        if batch < 1:
            raise InvalidInput("batch must be at least 1", field="batch")
        key_id, after, resealed = keys.current, "", 0

        def reseal_payloads(conn: Connection) -> Sequence[Any]:
            rows = conn.execute(
                q.PAYLOADS_TO_SEAL, {"key_id": key_id, "after": after, "limit": batch}
            ).all()
            for r in rows:
                text = payload_text(keys, r.op_id, r.canonical, r.key_id, r.sealed)
                assert text is not None  # a row is clear or sealed
                sealed = sealed_columns(keys, r.op_id, text)
                conn.execute(q.RESEAL_PAYLOAD, {"op_id": r.op_id, **sealed})
            return rows

        none: Sequence[Any] = ()
        while True:
            rows = self._cycle("a payload rotation batch", None, reseal_payloads, none)
            if not rows:
                break
            after, resealed = rows[-1].op_id, resealed + len(rows)
            if progress is not None:
                progress(len(rows))
        for to_seal, reseal, _ in q.RESULT_PLACES:  # the providers' result documents too
            resealed += self._reseal_results(keys, to_seal, reseal, batch, progress)
        with self._single() as conn:
            remaining = conn.execute(q.PAYLOADS_NOT_SEALED_UNDER, {"key_id": key_id}).scalar_one()
            for *_, not_sealed in q.RESULT_PLACES:
                remaining += conn.execute(not_sealed, {"key_id": key_id}).scalar_one()
        return Rotation(key_id=key_id, resealed=resealed, remaining=int(remaining))

    def _reseal_results(
        self,
        keys: PayloadKeys,
        to_seal: TextClause,
        reseal: TextClause,
        batch: int,
        progress: Callable[[int], None] | None,
    ) -> int:
        """Seal under the current key every result document of one place (evidence
        details, attempt responses) in clear or under an older key, a batch at a time.
        One that cannot be opened (its key no longer configured) is left as it is."""
        after, resealed = 0, 0

        def reseal_batch(conn: Connection) -> tuple[Sequence[Any], int]:
            rows = conn.execute(
                to_seal, {"key_id": keys.current, "after": after, "limit": batch}
            ).all()
            done = 0
            for r in rows:
                doc = open_result(keys, r.op_id, r.result)
                if set(doc) == {"unreadable"}:
                    continue
                sealed = seal_result(keys, r.op_id, doc)
                conn.execute(reseal, {"id": r.id, "result": store.to_json(sealed)})
                done += 1
            return rows, done

        nothing: tuple[Sequence[Any], int] = ((), 0)
        while True:
            rows, done = self._cycle("a result rotation batch", None, reseal_batch, nothing)
            if not rows:
                return resealed
            after, resealed = rows[-1].id, resealed + done
            if progress is not None:
                progress(done)

    def due_notifications(
        self, *, limit: int = 500, backoff: timedelta, interval: timedelta | None = None
    ) -> list[str]:
        """Operations whose open review has not been notified yet; each is handed out
        once per `backoff` until `mark_notified`. `interval` bounds its transaction."""

        def due(conn: Connection) -> list[str]:
            params = {"limit": limit, "backoff": backoff}
            return [r.op_id for r in conn.execute(q.DUE_NOTIFICATIONS, params)]

        return self._cycle("the hand-out of review notifications", interval, due, [])

    def mark_notified(self, review_id: int) -> None:
        """Record that the notification of a review is prepared (it is an operation itself)."""
        with self._single() as conn:
            conn.execute(q.MARK_NOTIFIED, {"review_id": review_id})

    def due_approval_notifications(
        self, *, limit: int = 500, backoff: timedelta, interval: timedelta | None = None
    ) -> list[str]:
        """Operations whose pending approval request has not been notified yet (their
        operation still waiting for it); each is handed out once per `backoff` until
        `mark_approval_notified`. `interval` bounds its transaction."""

        def due(conn: Connection) -> list[str]:
            params = {"limit": limit, "backoff": backoff}
            return [r.op_id for r in conn.execute(q.DUE_APPROVAL_NOTIFICATIONS, params)]

        return self._cycle("the hand-out of approval notifications", interval, due, [])

    def mark_approval_notified(self, op_id: str) -> None:
        """Record that the notification of `op_id`'s approval request is prepared (an
        operation itself), or that there is nothing to notify."""
        with self._single() as conn:
            conn.execute(q.MARK_APPROVAL_NOTIFIED, {"op_id": op_id})


def _expire_approvals(conn: Connection, limit: int, actor: str) -> list[str]:
    expired = [r.op_id for r in conn.execute(q.EXPIRE_APPROVALS, {"limit": limit, "actor": actor})]
    if expired:
        log.info("approvals expired, their operations cancelled: %s", ", ".join(expired))
    return expired


def _guard_state(row: Any) -> backlog.GuardState:
    return backlog.GuardState(
        sampled_at=row.sampled_at,
        depth_after=row.depth_after,
        counter=row.counter,
        drain_per_s=row.drain_per_s,
        shallow_since=row.shallow_since,
    )
