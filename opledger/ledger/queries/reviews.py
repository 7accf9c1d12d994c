"""The review queue: listing, showing, resolving, notifying."""

from __future__ import annotations

from sqlalchemy import text

from .columns import columns_of

# -- reviews --------------------------------------------------------------------------------

LIST_REVIEWS = text(
    """
    SELECT r.id AS review_id, o.id AS op_id, o.tenant, o.action, o.target, r.reason,
           r.opened_at, o.record_version
    FROM reviews AS r JOIN operations AS o ON o.id = r.op_id
    WHERE r.resolved_at IS NULL AND o.tenant = :tenant
      AND (CAST(:older_than AS interval) IS NULL OR r.opened_at < now() - :older_than)
      AND (CAST(:action AS text) IS NULL OR o.action LIKE :action)
      AND (CAST(:reason AS text) IS NULL OR r.reason ILIKE :reason)
    ORDER BY r.opened_at
    LIMIT :limit
    """
)

# Open reviews of one tenant, counted by action and reason (the console's queue header).
COUNT_REVIEWS = text(
    """
    SELECT o.action, r.reason, count(*) AS n, min(r.opened_at) AS oldest
    FROM reviews AS r JOIN operations AS o ON o.id = r.op_id
    WHERE r.resolved_at IS NULL AND o.tenant = :tenant
    GROUP BY o.action, r.reason
    ORDER BY min(r.opened_at)
    """
)

# Tenants with open reviews (for an operator of every tenant), with how many.
OPEN_REVIEW_TENANTS = text(
    """
    SELECT o.tenant, count(*) AS n
    FROM reviews AS r JOIN operations AS o ON o.id = r.op_id
    WHERE r.resolved_at IS NULL
    GROUP BY o.tenant ORDER BY o.tenant
    """
)

# Operations of one tenant by id, workflow or target (exact), newest first.
SEARCH_OPERATIONS = text(
    f"""
    SELECT {columns_of("o")} FROM operations AS o
    WHERE o.tenant = :tenant
      AND (CAST(:op_id AS text) IS NULL OR o.id = :op_id)
      AND (CAST(:workflow_id AS text) IS NULL OR o.workflow_id = :workflow_id)
      AND (CAST(:target AS text) IS NULL OR o.target = :target)
    ORDER BY o.id DESC
    LIMIT :limit
    """
)

# The operation and its open review, locked for a resolution; tenant-scoped.
LOCK_OPEN_REVIEW = text(
    f"""
    SELECT {columns_of("o")}, r.id AS review_id
    FROM operations AS o JOIN reviews AS r ON r.op_id = o.id AND r.resolved_at IS NULL
    WHERE o.id = :op_id AND o.tenant = :tenant
    FOR UPDATE OF o, r
    """
)

OPEN_REVIEW_FOR = text(
    """
    SELECT r.id, r.op_id, r.reason, r.opened_at, r.snapshot, r.resolution, r.resolved_by,
           r.resolved_at, r.note, r.notified_at
    FROM reviews AS r JOIN operations AS o ON o.id = r.op_id
    WHERE r.op_id = :op_id AND o.tenant = :tenant AND r.resolved_at IS NULL
    """
)

LAST_RESOLVED_REVIEW = text(
    """
    SELECT r.resolution, r.resolved_by, r.resolved_at
    FROM reviews AS r JOIN operations AS o ON o.id = r.op_id
    WHERE r.op_id = :op_id AND o.tenant = :tenant AND r.resolved_at IS NOT NULL
    ORDER BY r.resolved_at DESC LIMIT 1
    """
)

INSERT_VIEW = text(
    """
    INSERT INTO review_views (review_id, operator, record_version, shown)
    VALUES (:review_id, :operator, :record_version, CAST(:shown AS jsonb))
    RETURNING id
    """
)

LAST_VIEW = text(
    """
    SELECT record_version, shown, shown_at FROM review_views
    WHERE review_id = :review_id AND operator = :operator
    ORDER BY id DESC LIMIT 1
    """
)

SETTLE_BY_OPERATOR = text(
    f"""
    WITH op AS (
        UPDATE operations AS o
        SET status = CAST(:to_status AS op_status), fence = o.fence + 1,
            lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
            next_check_at = NULL, operator_retry_by = NULL,
            changed_by = :operator, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        -- deliberately checked twice: Reviews.resolve refuses a status other than unknown
        -- under the row lock first (test_guards.py, probe_operator_cannot_settle_...)
        WHERE o.id = :op_id AND o.fence = :fence AND o.status = 'unknown'
        RETURNING o.*
    )
    SELECT {columns_of("op")} FROM op
    """
)

AUTHORIZE_RETRY = text(
    f"""
    WITH op AS (
        UPDATE operations AS o
        SET operator_retry_by = :operator,
            idempotency_key = coalesce(CAST(:new_key AS text), o.idempotency_key),
            fence = o.fence + 1, next_check_at = now(),
            changed_by = :operator, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        -- deliberately checked twice: Reviews.resolve refuses a status other than unknown
        -- under the row lock first (test_guards.py, probe_operator_cannot_authorize_...)
        WHERE o.id = :op_id AND o.fence = :fence AND o.status = 'unknown'
        RETURNING o.*
    )
    SELECT {columns_of("op")} FROM op
    """
)

OPERATOR_EVIDENCE = text(
    """
    INSERT INTO evidence (op_id, fence, source, verdict, binding, detail, applied)
    VALUES (:op_id, :fence, 'operator', :verdict, '{}'::jsonb, CAST(:detail AS jsonb), true)
    """
)

CLOSE_REVIEW = text(
    """
    UPDATE reviews SET resolution = :resolution, resolved_by = :operator, resolved_at = now(),
                       note = :note
    WHERE id = :review_id AND resolved_at IS NULL
    """
)

INSERT_REVIEW_ACTION = text(
    """
    INSERT INTO review_actions (review_id, op_id, tenant, operator, resolution, note, evidence,
                                new_key, fence, shown, override_evidence, risk_acknowledged)
    VALUES (:review_id, :op_id, :tenant, :operator, :resolution, :note, :evidence, :new_key,
            :fence, CAST(:shown AS jsonb), :override_evidence, :risk_acknowledged)
    """
)

SELECT_REVIEW_ACTIONS = text(
    """
    SELECT id, review_id, op_id, tenant, operator, resolution, note, evidence, new_key, fence,
           shown, override_evidence, risk_acknowledged, at
    FROM review_actions WHERE op_id = :op_id AND tenant = :tenant ORDER BY id
    """
)

DUE_NOTIFICATIONS = text(
    """
    WITH due AS (
        SELECT id FROM reviews
        WHERE notified_at IS NULL AND resolved_at IS NULL
          AND coalesce(notify_due_at, opened_at) <= now()
        ORDER BY opened_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    )
    UPDATE reviews AS r SET notify_due_at = now() + :backoff
    FROM due WHERE r.id = due.id
    RETURNING r.op_id
    """
)

MARK_NOTIFIED = text(
    "UPDATE reviews SET notified_at = now() WHERE id = :review_id AND notified_at IS NULL"
)
