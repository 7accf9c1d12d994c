"""Claims, outcomes and settling: every statement that moves an operation under its fence."""

from __future__ import annotations

from sqlalchemy import text

from .approvals import CONSUME_APPROVAL, approval_cleared
from .columns import columns_of, grant_active
from .epochs import FRESH

# The claim: fence + 1, lease, attempt row and frozen payload in one statement. The grant
# is re-checked in the same WHERE, so a revoked authorization can never win a claim.
# The claim is good for starting a request until send_by = now() + the provider's send
# window; the attempt's in-flight deadline is send_by + the provider's max in-flight time,
# so no retry starts while a late sender could still be sending. An operation with an
# approval is claimed only once it is approved for exactly its digest and grant
# (`approvals.approval_cleared`); the first claim consumes it.
CLAIM = text(
    f"""
    WITH {FRESH},
    -- a first claim the ledger may have forgotten an ask of is not taken: quarantined
    suspect AS (
        SELECT true WHERE CAST(:from_status AS text) = 'prepared' AND opledger_suspect(:op_id)
    ),
    win AS (
        SELECT coalesce(
            make_interval(
                secs => (CAST(:window_map AS jsonb) ->> o.provider)::float8
            ),
            :send_window
        ) AS send_window,
        coalesce(
            make_interval(
                secs => (CAST(:in_flight_map AS jsonb) ->> o.provider)::float8
            ),
            :in_flight
        ) AS in_flight,
        o.provider
        FROM operations o WHERE o.id = :op_id
    ),
    -- pr: the provider's limits and pushback (opledger_admit): looked at only for a provider
    -- that has limits or has pushed back (a row of pressure), and only for an operation
    -- this claim could take (`op`'s conditions, read without a lock), so a waiting
    -- operation costs no claim, fence or attempt, and nothing is taken for one that is not
    -- claimable. Only the gate's refusal stops `op`: its own conditions stay its guards.
    pr AS (
        SELECT win.provider FROM win
        WHERE CAST(:limits_map AS jsonb) ? win.provider
           OR EXISTS (SELECT 1 FROM provider_pressure pp WHERE pp.provider = win.provider)
    ),
    ready AS (
        SELECT r.provider
        FROM pr
        JOIN operations r ON r.provider = pr.provider
        JOIN authorizations gr ON gr.ref = r.authorization_ref
        WHERE r.id = :op_id
          AND r.status = CAST(:from_status AS op_status)
          AND (r.lease_expires_at IS NULL OR r.lease_expires_at < now())
          AND (CAST(:expected_fence AS bigint) IS NULL OR r.fence = :expected_fence)
          AND r.waiting_on = 0
          AND {grant_active("gr")}
          AND (SELECT ok FROM fresh) AND NOT EXISTS (SELECT FROM suspect)
    ),
    gate AS (
        SELECT ready.provider, g.admitted, g.wait_s, g.why
        FROM ready CROSS JOIN win
        CROSS JOIN LATERAL opledger_admit(
            ready.provider, CAST(:limits_map AS jsonb) -> ready.provider, :token, :op_id,
            win.send_window + win.in_flight
        ) g
    ),
    op AS (
        UPDATE operations o
        SET status = 'dispatching', fence = o.fence + 1,
            lease_owner = :owner, lease_token = :token, lease_expires_at = now() + :lease,
            next_check_at = NULL, operator_retry_by = NULL,
            changed_by = :owner, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        FROM authorizations a
        -- deliberate overlap: the status and the lease expiry each refuse a live claim
        -- (tests/integration/test_guards.py, probe_a_live_claim_cannot_be_claimed_again)
        WHERE o.id = :op_id
          AND o.status = CAST(:from_status AS op_status)
          AND (o.lease_expires_at IS NULL OR o.lease_expires_at < now())
          AND (CAST(:expected_fence AS bigint) IS NULL OR o.fence = :expected_fence)
          AND o.waiting_on = 0
          -- approvals (0022): approved for exactly this digest and grant, and a first
          -- claim only while unconsumed; checked beside the hold, so a broken binding is
          -- never claimed even if `waiting_on` were wrong
          AND {approval_cleared("o")}
          AND a.ref = o.authorization_ref AND {grant_active("a")}
          AND coalesce((SELECT admitted FROM gate), true)
          AND (SELECT ok FROM fresh) AND NOT EXISTS (SELECT FROM suspect)
        RETURNING o.*
    ),
    attempt AS (
        INSERT INTO attempts (
            op_id, n, fence, owner, claim_token, idempotency_key, started_at, send_by,
            deadline_at, authorized_by
        )
        SELECT op.id,
               coalesce((SELECT max(n) FROM attempts WHERE op_id = op.id), 0) + 1,
               op.fence, :owner, :token, op.idempotency_key, now(),
               now() + win.send_window,
               now() + win.send_window + win.in_flight,
               :authorized_by
        FROM op CROSS JOIN win
        RETURNING n, started_at, send_by, deadline_at
    ),
    -- the first claim consumes its approval, once (a retry finds it consumed)
    consumed AS ({CONSUME_APPROVAL})
    SELECT {columns_of("op")}, attempt.n AS attempt_n, attempt.started_at AS attempt_started_at,
           attempt.deadline_at AS attempt_deadline_at, attempt.send_by AS attempt_send_by,
           now() AS db_now, p.canonical, p.key_id, p.sealed,
           gate.provider AS gate_provider, gate.admitted, gate.wait_s, gate.why,
           EXISTS (SELECT FROM suspect) AS suspect,
           fresh.epoch, fresh.timeline, fresh.flushed, fresh.ok
    FROM fresh
    LEFT JOIN gate ON true
    LEFT JOIN (op CROSS JOIN attempt) ON true
    LEFT JOIN operation_payloads p ON p.op_id = op.id
    """
)

# A claim the gate admitted but that lost its operation to another claimer: the slot it
# took goes back at once.
RELEASE_SLOT = text(
    """
    UPDATE provider_slots SET held_until = now(), claim_token = NULL, op_id = NULL
    WHERE claim_token = :token
    """
)

CLAIM_REFUSAL = text(
    f"""
    SELECT o.status::text AS status, o.authorization_ref, {grant_active("a")} AS grant_active
    FROM operations AS o JOIN authorizations AS a ON a.ref = o.authorization_ref
    WHERE o.id = :op_id
    """
)

# The outcome: attempt closed, evidence kept, status moved, all under the claim's fence and
# token. The evidence row is written whenever the claim's own attempt is still open, even
# when the fence has moved on (a stale worker's late result is a fact worth keeping); the
# status moves only while the claim still holds the operation. A kept late result is a new
# fact too: it bumps record_version (`late`), so a review shown before it is stale.
RECORD_OUTCOME = text(
    f"""
    WITH {FRESH},
    attempt AS (
        UPDATE attempts
        SET finished_at = now(), outcome = :kind, response = CAST(:response AS jsonb)
        -- the claim token is checked twice on purpose, here and on the operation below:
        -- either check alone keeps a forged claim from moving the operation; this one also
        -- keeps it off the attempt (test_guards.py, the forged_token probes)
        WHERE op_id = :op_id AND fence = :fence AND claim_token = :token
          AND finished_at IS NULL
          -- nothing is written on a ledger that went back since the process last saw it:
          -- the switch is recorded (and the operation quarantined) first
          AND (SELECT ok FROM fresh)
        RETURNING n
    ),
    op AS (
        UPDATE operations AS o
        SET status = CAST(:to_status AS op_status),
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            provider_result_id = coalesce(CAST(:receipt_id AS text), o.provider_result_id),
            evidence_checked_at = now(),
            next_check_at = CASE WHEN CAST(:to_status AS text) = 'unknown'
                                 THEN now() + :recheck END,
            changed_by = :actor, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        -- deliberate overlap: the open attempt (EXISTS), the lease token and the status
        -- each refuse a second report under one claim (test_guards.py, second_report probes)
        WHERE o.id = :op_id AND o.fence = :fence AND o.lease_token = :token
          AND o.status = 'dispatching' AND EXISTS (SELECT 1 FROM attempt)
        RETURNING o.*
    ),
    late AS (
        UPDATE operations AS o
        SET record_version = o.record_version + 1, evidence_checked_at = now(),
            updated_at = now()
        WHERE o.id = :op_id AND EXISTS (SELECT 1 FROM attempt) AND NOT EXISTS (SELECT 1 FROM op)
    ),
    evidence_row AS (
        INSERT INTO evidence (op_id, attempt_n, fence, source, verdict, binding, detail, applied)
        SELECT :op_id, attempt.n, :fence, :source, :kind, CAST(:binding AS jsonb),
               CAST(:detail AS jsonb), EXISTS (SELECT 1 FROM op)
        FROM attempt
    ),
    -- a fresh success that may repeat an earlier attempt (`evidence.possible_duplicate`):
    -- confirmed, and a person asked to check for a duplicate in the same commit (NULL
    -- reason on every other outcome: nothing is inserted)
    duplicate AS (
        INSERT INTO reviews (op_id, reason, snapshot)
        SELECT op.id, :review_reason, CAST(:review_snapshot AS jsonb) FROM op
        WHERE CAST(:review_reason AS text) IS NOT NULL AND op.status = 'confirmed'
        ON CONFLICT (op_id) WHERE resolved_at IS NULL DO NOTHING
    ),
    -- the call's concurrency slot goes back once it answered (a lost answer keeps it until
    -- the attempt's in-flight deadline, which it was taken for)
    slot AS (
        UPDATE provider_slots SET held_until = now(), claim_token = NULL, op_id = NULL
        WHERE claim_token = :token AND provider = :provider AND CAST(:release AS boolean)
        RETURNING slot
    ),
    -- a slot given back wakes the provider's oldest operation deferred for room: due now,
    -- and named in the row for the worker to publish (the relay publishes it if that is
    -- lost); if the provider is paused, that operation waits for the pause's end instead
    woken AS (
        UPDATE operations AS w SET next_check_at = now(), updated_at = now()
        WHERE w.id = (
            SELECT d.id FROM operations AS d
            WHERE d.provider = :provider AND d.status = 'prepared' AND d.next_check_at > now()
            ORDER BY d.created_at LIMIT 1
            FOR UPDATE SKIP LOCKED
        )
          AND EXISTS (SELECT 1 FROM slot)
        RETURNING w.id
    ),
    -- what the call says about the provider itself: reachable, refusing, or "not now" (an
    -- answer from a provider that never pushed back changes nothing: no call at all)
    pressure AS (
        SELECT opledger_press(
            :provider, :press, :pause, :press_reason, :breaker_after, :probe, :probe_max,
            :token
        ) AS breaker
        -- once per call: a report repeated (a retried commit) finds its attempt closed
        WHERE EXISTS (SELECT 1 FROM attempt)
          AND (CAST(:press AS text) IN ('refused', 'throttled')
               OR (CAST(:press AS text) = 'answered'
                   AND EXISTS (SELECT 1 FROM provider_pressure AS pp
                               WHERE pp.provider = :provider)))
    )
    SELECT (SELECT n FROM attempt) AS attempt_n, {columns_of("op")},
           (SELECT breaker FROM pressure) AS breaker, (SELECT id FROM woken) AS woken,
           fresh.epoch, fresh.timeline, fresh.flushed, fresh.ok
    FROM fresh LEFT JOIN op ON true
    """
)

FENCE_STATE = text(
    """
    SELECT o.fence, o.status::text AS status, a.claim_token AS attempt_token
    FROM operations AS o
    LEFT JOIN attempts AS a ON a.op_id = o.id AND a.fence = :fence
    WHERE o.id = :op_id
    """
)

CANCEL = text(
    f"""
    WITH op AS (
        UPDATE operations AS o
        SET status = 'cancelled', fence = o.fence + 1, next_check_at = NULL,
            changed_by = :actor, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        WHERE o.id = :op_id AND (
            o.status = 'prepared'
            -- or nothing of it ever reached a provider: every attempt finished and
            -- provably sent nothing (held for want of an adapter, a refused connection,
            -- a send window that had passed), and no review is open on it
            OR (o.status = 'unknown'
                AND NOT EXISTS (SELECT 1 FROM attempts AS a WHERE a.op_id = o.id
                                AND (a.finished_at IS NULL
                                     OR a.response ->> 'code' IS DISTINCT FROM 'not_sent'))
                AND NOT EXISTS (SELECT 1 FROM reviews AS r WHERE r.op_id = o.id
                                AND r.resolved_at IS NULL))
        )
        RETURNING o.*
    )
    SELECT {columns_of("op")} FROM op
    """
)

INSERT_EVIDENCE = text(
    """
    WITH op AS (
        UPDATE operations
        SET evidence_checked_at = now(), updated_at = now(), record_version = record_version + 1
        WHERE id = :op_id
        RETURNING id
    )
    INSERT INTO evidence (op_id, attempt_n, fence, source, verdict, binding, detail, applied)
    SELECT op.id, :attempt_n, :fence, :source, :verdict, CAST(:binding AS jsonb),
           CAST(:detail AS jsonb), false
    FROM op
    RETURNING id, op_id, attempt_n, fence, source, verdict, binding, detail, applied, recorded_at
    """
)

# Settle an unknown operation on evidence, conditional on the fence the decision saw.
SETTLE_ON_EVIDENCE = text(
    f"""
    WITH op AS (
        UPDATE operations AS o
        SET status = CAST(:to_status AS op_status), fence = o.fence + 1,
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_check_at = NULL, evidence_checked_at = now(),
            provider_result_id = coalesce(CAST(:receipt_id AS text), o.provider_result_id),
            changed_by = :actor, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        -- the status check is the only guard against settling a live claim or settling twice;
        -- a flip of a settled operation is also refused by the transition trigger, on
        -- purpose (test_guards.py, probe_a_settled_operation_never_flips)
        WHERE o.id = :op_id AND o.fence = :fence AND o.status = 'unknown'
        RETURNING o.*
    ),
    applied AS (
        UPDATE evidence SET applied = true
        WHERE id = :evidence_id AND op_id = :op_id AND EXISTS (SELECT 1 FROM op)
    ),
    -- evidence that arrived while a person was reviewing it settles the review too; not
    -- evidence of a possible duplicate (a review reason given): see `turned`
    closed AS (
        UPDATE reviews SET resolution = :to_status, resolved_by = :actor, resolved_at = now(),
                           note = :reason
        WHERE op_id = :op_id AND resolved_at IS NULL AND EXISTS (SELECT 1 FROM op)
          AND CAST(:review_reason AS text) IS NULL
    ),
    -- a confirmation on evidence marked possible_duplicate (`evidence.possible_duplicate`,
    -- kept from a fenced-out worker): the review a person has open becomes the review of
    -- the possible duplicate (its snapshot merged, notified anew) ...
    turned AS (
        UPDATE reviews AS r
        SET reason = :review_reason,
            snapshot = r.snapshot || CAST(:review_snapshot AS jsonb)
                       || jsonb_build_object('review_before', jsonb_build_object(
                              'reason', r.reason, 'opened_at', r.opened_at)),
            notified_at = NULL, notify_due_at = NULL
        FROM op
        WHERE r.op_id = op.id AND r.resolved_at IS NULL AND op.status = 'confirmed'
          AND CAST(:review_reason AS text) IS NOT NULL
        RETURNING r.id
    ),
    -- ... or, none open, one is opened: in the same statement as the confirmation (NULL
    -- reason on every other settlement: nothing is inserted)
    duplicate AS (
        INSERT INTO reviews (op_id, reason, snapshot)
        SELECT op.id, :review_reason, CAST(:review_snapshot AS jsonb) FROM op
        WHERE CAST(:review_reason AS text) IS NOT NULL AND op.status = 'confirmed'
          AND NOT EXISTS (SELECT 1 FROM turned)
        ON CONFLICT (op_id) WHERE resolved_at IS NULL DO NOTHING
    )
    SELECT {columns_of("op")} FROM op
    """
)

SCHEDULE_CHECK = text(
    f"""
    UPDATE operations AS o
    SET next_check_at = :next_check_at, updated_at = now()
    WHERE o.id = :op_id AND o.fence = :fence AND o.status = 'unknown'
    RETURNING {columns_of("o")}
    """
)

# Open a review (at most one open per operation); the sweeper stops re-checking it.
OPEN_REVIEW = text(
    """
    WITH op AS (
        UPDATE operations AS o
        SET next_check_at = NULL, updated_at = now()
        WHERE o.id = :op_id AND o.fence = :fence AND o.status = 'unknown'
        RETURNING o.id
    )
    INSERT INTO reviews (op_id, reason, snapshot)
    SELECT op.id, :reason, CAST(:snapshot AS jsonb) FROM op
    ON CONFLICT (op_id) WHERE resolved_at IS NULL DO NOTHING
    RETURNING id, op_id, reason, opened_at, snapshot, resolution, resolved_by, resolved_at, note,
              notified_at
    """
)
