"""Operations, grants, asks, dependencies and the reads of an operation (its claims,
outcomes and settling: `claims`)."""

from __future__ import annotations

from sqlalchemy import TextClause, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from .columns import AUTH_COLUMNS, columns_of, grant_active

INSERT_AUTHORIZATION: TextClause = text(
    f"""
    INSERT INTO authorizations AS a (ref, tenant, scope, granted_by, expires_at)
    VALUES (:ref, :tenant, :scope, :granted_by, :expires_at)
    ON CONFLICT (ref) DO NOTHING
    RETURNING {AUTH_COLUMNS}
    """
).bindparams(bindparam("scope", type_=ARRAY(Text)))

SELECT_AUTHORIZATION = text(f"SELECT {AUTH_COLUMNS} FROM authorizations AS a WHERE a.ref = :ref")

LIST_AUTHORIZATIONS = text(
    f"""
    SELECT {AUTH_COLUMNS} FROM authorizations AS a
    WHERE (CAST(:tenant AS text) IS NULL OR a.tenant = :tenant)
    ORDER BY a.granted_at DESC, a.ref
    LIMIT :limit
    """
)

REVOKE_AUTHORIZATION = text(
    f"""
    UPDATE authorizations AS a
    SET revoked_at = now(), revoked_by = :by, revoke_reason = :reason
    WHERE a.ref = :ref AND a.revoked_at IS NULL
    RETURNING {AUTH_COLUMNS}
    """
)

_OPERATION_VALUES = """
    :id, :tenant, :workflow_id, :intent_key, :intent_scope, :action, :target, :provider,
    :payload_digest, :payload_size, :authorization_ref, :idempotency_key,
    :actor, 'prepared', :waiting_on, :notify_settle, :traceparent
"""


def _inserting(rows: str) -> TextClause:
    """The insert of a new operation (its row from `rows`) with its frozen payload and its
    ask, in one statement; nothing when the intent is already recorded: a run's act in its
    run (`uq_operations_intent`), a tenant-wide act in its tenant
    (`uq_operations_tenant_intent`) — the conflict names no one constraint, so either
    counts (the operation's id is new: no other unique column can clash)."""
    return text(
        f"""
    WITH ins AS (
        INSERT INTO operations (
            id, tenant, workflow_id, intent_key, intent_scope, action, target, provider,
            payload_digest, payload_size, authorization_ref, idempotency_key,
            changed_by, change_reason, waiting_on, notify_settle, traceparent
        )
        {rows}
        ON CONFLICT DO NOTHING
        RETURNING *
    ),
    payload AS (
        INSERT INTO operation_payloads (op_id, canonical, key_id, sealed)
        SELECT id, :canonical, :key_id, CAST(:sealed AS bytea) FROM ins
    ),
    ask AS (
        INSERT INTO intent_asks (op_id, asked_by, actor, payload_digest, authorization_ref)
        SELECT id, :asked_by, :actor, payload_digest, authorization_ref FROM ins
        WHERE CAST(:record_ask AS boolean)
    )
    SELECT {columns_of("ins")} FROM ins
    """
    )


INSERT_OPERATION = _inserting(f"VALUES ({_OPERATION_VALUES})")

# The same insert when the grant allows it, checked in the statement itself (the tenant's,
# active, a scope pattern covering the action: `*` any run of characters, `.` itself, as
# `grants._check_grant` reads them): a new intent under a good grant is recorded in one
# round trip. Nothing inserted (no such grant, another tenant's, revoked, out of scope, or
# the intent already recorded) sends the ask down the full path, which says which it was.
INSERT_GRANTED_OPERATION = _inserting(
    f"""
    SELECT {_OPERATION_VALUES}
    FROM authorizations AS a
    WHERE a.ref = :authorization_ref AND a.tenant = :tenant AND {grant_active("a")}
      AND EXISTS (
          SELECT 1 FROM unnest(a.scope) AS p
          WHERE CAST(:action AS text)
                ~ ('^' || replace(replace(p, '.', '[.]'), '*', '.*') || '$')
      )
    """
)

# An ask of an intent already recorded (`Ledger.ask`): who asked, with what, and which
# parts of the recorded intent it asked differently (nothing of those was sent).
INSERT_ASK = text(
    """
    INSERT INTO intent_asks (op_id, asked_by, actor, payload_digest, authorization_ref, differs)
    VALUES (:op_id, :asked_by, :actor, :payload_digest, :authorization_ref, :differs)
    """
).bindparams(bindparam("differs", type_=ARRAY(Text)))

SELECT_ASKS = text(
    """
    SELECT id, op_id, asked_at, asked_by, actor, payload_digest, authorization_ref, differs
    FROM intent_asks WHERE op_id = :op_id ORDER BY id
    """
)

SELECT_OPERATION = text(f"SELECT {columns_of('o')} FROM operations AS o WHERE o.id = :op_id")

SELECT_OPERATION_BY_INTENT = text(
    f"""
    SELECT {columns_of("o")} FROM operations AS o
    WHERE o.tenant = :tenant AND o.workflow_id = :workflow_id AND o.intent_key = :intent_key
    """
)

# A tenant-wide act (intent scope `tenant`) as recorded, whatever run asked it first: its
# key has a form no run's key takes (`intents.tenant_wide`), unique in the tenant.
SELECT_OPERATION_BY_TENANT_INTENT = text(
    f"""
    SELECT {columns_of("o")} FROM operations AS o
    WHERE o.tenant = :tenant AND o.intent_key = :intent_key AND o.intent_scope = 'tenant'
    """
)

# -- ordered effects -------------------------------------------------------------------------

# The operations a new one runs after, locked (a row lock, like FOR UPDATE) and marked, in
# the preparing transaction: a dependency confirmed concurrently either committed before
# (its status is read here as confirmed) or waits for this transaction and then finds the
# new dependency row (the 0008 trigger counts it down).
LOCK_DEPENDENCIES = text(
    """
    UPDATE operations AS o SET has_dependents = true
    FROM (SELECT id FROM operations WHERE id = ANY(:after) AND tenant = :tenant
          ORDER BY id FOR UPDATE) AS locked
    WHERE o.id = locked.id
    RETURNING o.id, o.status::text AS status, o.change_reason
    """
).bindparams(bindparam("after", type_=ARRAY(Text)))

INSERT_DEPENDENCIES = text(
    "INSERT INTO operation_deps (op_id, dep_id) SELECT :op_id, unnest(CAST(:after AS text[]))"
).bindparams(bindparam("after", type_=ARRAY(Text)))

SELECT_DEPENDENCY_IDS = text("SELECT dep_id FROM operation_deps WHERE op_id = :op_id")

# Whether `op_id` is among `after` or anything they (transitively) run after.
REACHES = text(
    """
    WITH RECURSIVE reach(id) AS (
        SELECT unnest(CAST(:after AS text[]))
        UNION
        SELECT d.dep_id FROM operation_deps AS d JOIN reach ON d.op_id = reach.id
    )
    SELECT EXISTS (SELECT 1 FROM reach WHERE id = :op_id)
    """
).bindparams(bindparam("after", type_=ARRAY(Text)))

SELECT_DEPENDENCIES = text(
    """
    SELECT o.id AS op_id, o.action, o.target, o.status, o.change_reason AS reason,
           r.id AS review_id, r.reason AS review_reason
    FROM operation_deps AS d
    JOIN operations AS o ON o.id = d.dep_id
    LEFT JOIN reviews AS r ON r.op_id = o.id AND r.resolved_at IS NULL
    WHERE d.op_id = :op_id
    ORDER BY o.id
    """
)

WATCH = text("UPDATE operations SET notify_settle = true WHERE id = :op_id AND NOT notify_settle")

# How operations stand, as an agent waiting on them is answered (`Ledger.answers`), in one
# statement: each with why its status last changed (`change_reason`: every statement that
# sets it changes the status or the fence, so it is the newest transition's reason); once
# confirmed or rejected, the detail of the evidence that settled it; while unknown, the
# review a person holds it with; while it waits on dependencies (prepared, `waiting_on`
# above 0), those not confirmed yet, each with the review holding it. A part the status
# rules out is not looked up (a one-time filter); the others are found by op_id indexes.
SELECT_ANSWERS = text(
    f"""
    SELECT {columns_of("o")},
        o.change_reason AS last_reason,
        (SELECT e.detail FROM evidence AS e
         WHERE o.status IN ('confirmed', 'rejected') AND e.op_id = o.id AND e.applied
           AND e.verdict = o.status::text
         ORDER BY e.id DESC LIMIT 1) AS settled_detail,
        (SELECT to_jsonb(r) FROM (
            SELECT id, op_id, reason, opened_at, snapshot, resolution, resolved_by,
                   resolved_at, note, notified_at
            FROM reviews
            WHERE o.status = 'unknown' AND op_id = o.id AND resolved_at IS NULL
            ORDER BY id DESC LIMIT 1) AS r) AS open_review,
        (SELECT jsonb_agg(jsonb_build_object(
                    'op_id', d.id, 'action', d.action, 'target', d.target,
                    'status', d.status, 'reason', d.change_reason,
                    'review_id', dr.id, 'review_reason', dr.reason) ORDER BY d.id)
         FROM operation_deps AS od
         JOIN operations AS d ON d.id = od.dep_id
         LEFT JOIN reviews AS dr ON dr.op_id = d.id AND dr.resolved_at IS NULL
         WHERE o.status = 'prepared' AND o.waiting_on > 0 AND od.op_id = o.id
           AND d.status <> 'confirmed') AS blocked_by,
        -- unknown, yet no attempt may have reached the provider (each one's outcome was
        -- not_sent): why the newest sent nothing
        (SELECT e.detail->>'why' FROM evidence AS e
         WHERE o.status = 'unknown' AND e.op_id = o.id AND e.source = 'dispatch'
           AND NOT EXISTS (
               SELECT 1 FROM attempts AS a WHERE a.op_id = o.id AND NOT EXISTS (
                   SELECT 1 FROM evidence AS s WHERE s.op_id = a.op_id AND s.attempt_n = a.n
                     AND s.source = 'dispatch' AND s.detail->>'code' = 'not_sent'))
         ORDER BY e.id DESC LIMIT 1) AS unsent_why,
        -- prepared and held for a person's approval: the request, while it is pending
        (SELECT jsonb_build_object(
                    'requested_at', ap.requested_at, 'expires_at', ap.expires_at,
                    'approvers_required', ap.approvers_required,
                    'approved_by', to_jsonb(ap.approved_by), 'reasons', to_jsonb(ap.reasons))
         FROM approvals AS ap
         WHERE o.status = 'prepared' AND ap.op_id = o.id AND ap.status = 'pending')
            AS awaiting_approval
    FROM operations AS o
    WHERE o.id = ANY(:ids)
    """
).bindparams(bindparam("ids", type_=ARRAY(Text)))

# The frozen payload's row: in clear (`canonical`), or sealed under `key_id` (decrypted in
# Python: the database never sees a key).
SELECT_PAYLOAD = text(
    "SELECT canonical, key_id, sealed FROM operation_payloads WHERE op_id = :op_id"
)

# Newest first, a page at a time: ids are time-ordered (ULIDs), so the next page is the
# operations whose id sorts before the last one shown (`:before`, keyset paging on the
# primary key: no offset to skip, no row shown twice while new ones arrive). `:action` is
# a LIKE pattern (an exact action with its "_" escaped, or a prefix).
LIST_OPERATIONS = text(
    f"""
    SELECT {columns_of("o")} FROM operations AS o
    WHERE (CAST(:statuses AS text[]) IS NULL OR o.status::text = ANY(CAST(:statuses AS text[])))
      AND (CAST(:tenant AS text) IS NULL OR o.tenant = :tenant)
      AND (CAST(:workflow_id AS text) IS NULL OR o.workflow_id = :workflow_id)
      AND (CAST(:action AS text) IS NULL OR o.action LIKE :action)
      AND (CAST(:before AS text) IS NULL OR o.id < :before)
    ORDER BY o.id DESC
    LIMIT :limit
    """
).bindparams(bindparam("statuses", type_=ARRAY(Text)))

SELECT_ATTEMPTS = text(
    """
    SELECT op_id, n, fence, owner, idempotency_key, started_at, deadline_at, finished_at,
           outcome, response, authorized_by, send_by
    FROM attempts WHERE op_id = :op_id ORDER BY n
    """
)

SELECT_EVIDENCE = text(
    """
    SELECT id, op_id, attempt_n, fence, source, verdict, binding, detail, applied, recorded_at
    FROM evidence WHERE op_id = :op_id ORDER BY id
    """
)

SELECT_TRANSITIONS = text(
    """
    SELECT id, op_id, from_status, to_status, fence, actor, reason, at
    FROM transitions WHERE op_id = :op_id ORDER BY id
    """
)

SELECT_REVIEWS = text(
    """
    SELECT id, op_id, reason, opened_at, snapshot, resolution, resolved_by, resolved_at, note,
           notified_at
    FROM reviews WHERE op_id = :op_id ORDER BY id
    """
)
