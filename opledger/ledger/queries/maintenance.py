"""Beat's statements: expired leases, due checks, the relay, the backlog guard, purging.

Each runs in a bounded transaction (`BOUND_TRANSACTION` first): none waits for another's
lock or sits idle between its statements longer than the bound, and none waits for a row
another maintenance transaction holds (`SKIP LOCKED`), so a frozen process holding one
costs the others at most its bound (`ledger.maintenance`)."""

from __future__ import annotations

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

# -- maintenance (beat) ---------------------------------------------------------------------

# The first statement of every maintenance transaction: for this transaction only, a lock
# is waited for at most `lock_ms`, and the server ends the session when the transaction
# sits idle (its process frozen, stopped, paused) longer than `idle_ms`, rolling back
# whatever it did and releasing its locks. Both as milliseconds in text.
BOUND_TRANSACTION = text(
    """
    SELECT set_config('lock_timeout', :lock_ms, true),
           set_config('idle_in_transaction_session_timeout', :idle_ms, true)
    """
)

# Expired leases: the worker may have died or stalled. Fence it out (fence + 1) and make the
# operation unknown, due for reconciliation now. SKIP LOCKED: overlapping sweeps share out.
EXPIRE_LEASES = text(
    """
    WITH stale AS (
        SELECT id FROM operations
        WHERE status = 'dispatching' AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ),
    op AS (
        UPDATE operations AS o
        SET status = 'unknown', fence = o.fence + 1,
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_check_at = now() + :backoff, record_version = o.record_version + 1,
            changed_by = :actor, change_reason = 'lease expired', updated_at = now()
        FROM stale WHERE o.id = stale.id
        RETURNING o.id, o.fence
    )
    SELECT id FROM op
    """
)

# Unknown operations whose check is due. Pushing next_check_at forward is the sweep's
# claim on the check: a lost reconcile message makes it due again after `backoff`. Each
# hand-out is numbered (check_gen), and the number travels in the reconcile message.
DUE_CHECKS = text(
    """
    WITH due AS (
        SELECT id FROM operations
        WHERE status = 'unknown' AND next_check_at <= now()
        ORDER BY next_check_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE operations AS o
    SET next_check_at = now() + :backoff, check_gen = o.check_gen + 1
    FROM due WHERE o.id = due.id
    RETURNING o.id, o.check_gen
    """
)

# Prepared operations whose message is plausibly lost: nobody claimed them for `after`
# since their last publish, and each re-publication doubles that wait (capped), so an
# operation whose message is merely late is not published again and again; a publish that
# was due (a provider's wait ended, a dependency was confirmed) starts the doubling again.
# One waiting on a dependency is never published; one whose last dependency was confirmed
# is published at once (its earlier messages found it waiting and were dropped); one
# deferred for its provider's room not before its time.
# The budget (`limit`) is shared by the providers in turns: each provider's oldest first,
# then each one's second, and so on (`turn`), so a provider with a backlog of thousands
# takes no more of a run than one with a handful, and the queue gets them interleaved. The
# rows are locked after the choice (SKIP LOCKED: a row another relay holds is left to it),
# their conditions checked again under the lock.
RELAY_CANDIDATES = text(
    """
    WITH due AS (
        SELECT id, provider, created_at FROM operations
        WHERE status = 'prepared' AND waiting_on = 0
          -- a provider's capacity it waits for (next_check_at on a prepared operation):
          -- not before then, and then at once
          AND (next_check_at IS NULL OR next_check_at <= now())
          AND (
            -- its last dependency was just confirmed: nobody has published it yet
            released_at IS NOT NULL
            OR next_check_at IS NOT NULL
            OR (created_at < now() - :after
                AND coalesce(enqueued_at, created_at)
                    < now() - :after * power(2, least(relay_lost, :max_doublings)))
          )
    ),
    turns AS (
        SELECT id, created_at,
               row_number() OVER (PARTITION BY provider ORDER BY created_at, id) AS turn
        FROM due
    ),
    chosen AS (
        SELECT id, turn, created_at FROM turns ORDER BY turn, created_at, id LIMIT :limit
    )
    SELECT o.id, o.relay_gen FROM operations AS o JOIN chosen ON chosen.id = o.id
    WHERE o.status = 'prepared' AND o.waiting_on = 0
      AND (o.next_check_at IS NULL OR o.next_check_at <= now())
    ORDER BY chosen.turn, chosen.created_at, o.id
    FOR UPDATE OF o SKIP LOCKED
    """
)

MARK_ENQUEUED = text(
    """
    UPDATE operations SET enqueued_at = now(), relay_gen = relay_gen + 1, released_at = NULL,
                          next_check_at = NULL,
                          -- a publish that was due (a provider's wait ended, a dependency
                          -- was confirmed) starts the lost-message backoff again
                          relay_lost = CASE WHEN released_at IS NULL AND next_check_at IS NULL
                                            THEN relay_lost + 1 ELSE 0 END
    WHERE id = ANY(:ids) AND status = 'prepared'
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)))

# The backlog guard's state for one queue (see ledger/backlog.py), locked for one run. A
# guard another run holds is skipped, never waited for: that run is publishing into the
# queue this cycle (or is frozen, and its transaction ends at its idle bound). No row:
# either none was made yet or another run holds it; ENSURE_QUEUE_GUARD tells which (a row
# it returns is new, and this transaction's).
LOCK_QUEUE_GUARD = text(
    """
    SELECT sampled_at, depth_after, counter, drain_per_s, shallow_since, now() AS now
    FROM queue_guards WHERE queue = :queue
    FOR UPDATE SKIP LOCKED
    """
)

ENSURE_QUEUE_GUARD = text(
    """
    INSERT INTO queue_guards (queue) VALUES (:queue) ON CONFLICT (queue) DO NOTHING
    RETURNING queue
    """
)

SELECT_QUEUE_GUARD = text(
    """
    SELECT sampled_at, depth_after, counter, drain_per_s, shallow_since
    FROM queue_guards WHERE queue = :queue
    """
)

SAVE_QUEUE_GUARD = text(
    """
    UPDATE queue_guards
    SET sampled_at = :sampled_at, depth_after = :depth_after, counter = :counter,
        drain_per_s = :drain_per_s, shallow_since = :shallow_since
    WHERE queue = :queue
    """
)

# Claims numbered so far (the attempts' identity): what the workers consumed from dispatch.
CLAIM_COUNTER = text("SELECT coalesce(max(id), 0) FROM attempts")

PURGE_PAYLOADS = text(
    """
    WITH old AS (
        SELECT p.op_id FROM operation_payloads AS p
        JOIN operations AS o ON o.id = p.op_id
        WHERE o.status IN ('confirmed', 'rejected', 'cancelled')
          AND o.updated_at < now() - :older_than
        LIMIT :limit
        FOR UPDATE OF p SKIP LOCKED
    )
    DELETE FROM operation_payloads AS p USING old WHERE p.op_id = old.op_id
    RETURNING p.op_id
    """
)

# Key rotation (`opledger payloads rotate`): the next batch of payload rows not sealed under
# the current key (clear ones too), in id order after the last batch's, each locked for
# its re-encryption; rows a purge or another rotation holds are skipped, not waited for.
PAYLOADS_TO_SEAL = text(
    """
    SELECT op_id, canonical, key_id, sealed FROM operation_payloads
    WHERE key_id IS DISTINCT FROM :key_id AND op_id > :after
    ORDER BY op_id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

RESEAL_PAYLOAD = text(
    """
    UPDATE operation_payloads
    SET canonical = NULL, key_id = :key_id, sealed = CAST(:sealed AS bytea)
    WHERE op_id = :op_id
    """
)

PAYLOADS_NOT_SEALED_UNDER = text(
    "SELECT count(*) FROM operation_payloads WHERE key_id IS DISTINCT FROM :key_id"
)

# A provider's result document, where it is kept (an evidence detail's "result", an
# attempt response's "result"), not yet sealed under the current key: in clear, or sealed
# under another one. `{table}`/`{column}` name the two places.
_RESULTS_TO_SEAL = """
    SELECT id, op_id, {column} -> 'result' AS result FROM {table}
    WHERE jsonb_typeof({column} -> 'result') = 'object'
      AND {column} -> 'result' ->> 'key_id' IS DISTINCT FROM :key_id
      AND NOT ({column} -> 'result' ? 'omitted')
      AND id > :after
    ORDER BY id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
"""
_RESEAL_RESULT = """
    UPDATE {table} SET {column} = jsonb_set({column}, '{{result}}', CAST(:result AS jsonb))
    WHERE id = :id
"""
_RESULTS_NOT_SEALED_UNDER = """
    SELECT count(*) FROM {table}
    WHERE jsonb_typeof({column} -> 'result') = 'object'
      AND {column} -> 'result' ->> 'key_id' IS DISTINCT FROM :key_id
      AND NOT ({column} -> 'result' ? 'omitted')
"""
#: (what is sealed, what reseals one, what counts the rest), for evidence, then attempts
RESULT_PLACES: tuple[tuple[TextClause, TextClause, TextClause], ...] = tuple(
    (
        text(_RESULTS_TO_SEAL.format(table=table, column=column)),
        text(_RESEAL_RESULT.format(table=table, column=column)),
        text(_RESULTS_NOT_SEALED_UNDER.format(table=table, column=column)),
    )
    for table, column in (("evidence", "detail"), ("attempts", "response"))
)
