"""Approvals: the request recorded with its operation, each decision one conditional
statement, their expiry, the claim's guard, and who may approve (operators' `approves`)."""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from .columns import grant_active


def approval_cleared(o: str) -> str:
    """Whether the operation `o` may be claimed as far as approval goes: it has no approval
    row, or one approved for exactly its frozen payload's digest and its grant, not yet
    consumed by a first claim (a retry of an operation already claimed, no longer
    prepared, runs under the approval its first claim consumed). Checked in the claim's
    WHERE beside `waiting_on = 0`, so a broken binding is never claimed even if the hold
    were wrong."""
    return f"""NOT EXISTS (
        SELECT FROM approvals ap WHERE ap.op_id = {o}.id AND NOT (
            ap.status = 'approved' AND (ap.payload_digest, ap.authorization_ref)
            = ({o}.payload_digest, {o}.authorization_ref)
            AND (ap.consumed_at IS NULL OR {o}.status <> 'prepared')))"""


# The first claim consumes the approval, once: its time and the fence it was claimed at.
CONSUME_APPROVAL = """
    UPDATE approvals ap SET consumed_at = now(), consumed_fence = op.fence
    FROM op WHERE ap.op_id = op.id AND ap.consumed_at IS NULL
"""


def _covers(patterns: str, action: str) -> str:
    """Whether one of the action patterns `patterns` (text[]: `*` any run of characters, `.`
    itself, as a grant's scope) covers `action`."""
    return f"""EXISTS (
        SELECT 1 FROM unnest({patterns}) AS pat
        WHERE {action} ~ ('^' || replace(replace(pat, '.', '[.]'), '*', '.*') || '$'))"""


def _approver(p: str, ap: str) -> str:
    """Whether operator `p` may decide approval `ap`: enabled, acting for its tenant, with
    an approval scope covering its action."""
    return f"""{p}.disabled_at IS NULL
        AND ({p}.all_tenants OR {ap}.tenant = ANY ({p}.tenants))
        AND {_covers(f"{p}.approves", f"{ap}.action")}"""


def _not_the_asker(p: str, ap: str) -> str:
    """Whether operator `p` is not who asked for the act: the actor that recorded it, the
    asker it named, or any actor or asker of an ask of it since."""
    return f"""{p}.name <> {ap}.requested_by AND {p}.name IS DISTINCT FROM {ap}.asked_by
        AND NOT EXISTS (SELECT 1 FROM intent_asks AS ia WHERE ia.op_id = {ap}.op_id
                        AND (ia.asked_by = {p}.name OR ia.actor = {p}.name))"""


APPROVAL_COLUMNS = """
    ap.op_id, ap.tenant, ap.action, ap.target, ap.payload_digest, ap.authorization_ref,
    ap.requested_by, ap.asked_by, ap.reasons, ap.approvers_required, ap.approved_by,
    ap.status, ap.requested_at, ap.expires_at, ap.decided_at, ap.decided_by,
    ap.consumed_at, ap.consumed_fence
"""

# Recorded in the transaction that records the operation, bound to its row as inserted.
INSERT_APPROVAL = text(
    """
    INSERT INTO approvals (
        op_id, tenant, action, target, payload_digest, authorization_ref, requested_by,
        asked_by, reasons, approvers_required, expires_at
    )
    SELECT o.id, o.tenant, o.action, o.target, o.payload_digest, o.authorization_ref,
           :requested_by, :asked_by, :reasons, :approvers, now() + :expires_after
    FROM operations AS o WHERE o.id = :op_id
    """
).bindparams(bindparam("reasons", type_=ARRAY(Text)))

# One approval, in one statement: only a pending, unexpired approval whose operation is
# still prepared under the same digest (the one the approver was shown) and grant (still
# active), by an operator who may approve it and is not its asker, who has not approved it
# already. The last approval needed releases the operation's hold (`waiting_on` - 1; at 0
# the relay publishes it at once, `released_at`) in the same statement. Two approvals at
# once queue on the approval's row; the second reads the first's (`approved_by`).
APPROVE = text(
    f"""
    WITH upd AS (
        UPDATE approvals AS ap
        SET approved_by = array_append(ap.approved_by, CAST(:operator AS text)),
            status = CASE WHEN cardinality(ap.approved_by) + 1 >= ap.approvers_required
                          THEN 'approved' ELSE 'pending' END,
            decided_at = CASE WHEN cardinality(ap.approved_by) + 1 >= ap.approvers_required
                              THEN now() END,
            decided_by = CASE WHEN cardinality(ap.approved_by) + 1 >= ap.approvers_required
                              THEN CAST(:operator AS text) END
        FROM operations AS o, authorizations AS a, operators AS p
        WHERE ap.op_id = :op_id AND o.id = ap.op_id AND a.ref = o.authorization_ref
          AND p.name = :operator
          AND ap.status = 'pending' AND ap.expires_at > now() AND o.status = 'prepared'
          AND ap.payload_digest = :digest AND o.payload_digest = ap.payload_digest
          AND o.authorization_ref = ap.authorization_ref AND {grant_active("a")}
          AND {_approver("p", "ap")}
          AND {_not_the_asker("p", "ap")}
          AND NOT (CAST(:operator AS text) = ANY (ap.approved_by))
        RETURNING {APPROVAL_COLUMNS}
    ),
    released AS (
        UPDATE operations AS o
        SET waiting_on = o.waiting_on - 1,
            released_at = CASE WHEN o.waiting_on = 1 THEN now() ELSE o.released_at END,
            record_version = o.record_version + 1, updated_at = now()
        FROM upd
        WHERE o.id = upd.op_id AND upd.status = 'approved' AND o.status = 'prepared'
        RETURNING o.id
    ),
    decision AS (
        INSERT INTO approval_decisions (
            op_id, tenant, operator, decision, payload_digest, authorization_ref, shown, note
        )
        SELECT upd.op_id, upd.tenant, :operator, 'approved', upd.payload_digest,
               upd.authorization_ref, CAST(:shown AS jsonb), :note
        FROM upd
    )
    SELECT upd.*, EXISTS (SELECT 1 FROM released) AS released FROM upd
    """
)

# A denial, in one statement: the approval denied and its operation cancelled with the
# reason (what runs after it is cancelled too, by the dependency trigger), by an operator
# who may approve it, shown the operation's digest. Expired or not yet swept, a pending
# approval may be denied.
DENY = text(
    f"""
    WITH upd AS (
        UPDATE approvals AS ap
        SET status = 'denied', decided_at = now(), decided_by = CAST(:operator AS text)
        FROM operations AS o, operators AS p
        WHERE ap.op_id = :op_id AND o.id = ap.op_id AND p.name = :operator
          AND ap.status = 'pending' AND o.status = 'prepared'
          AND ap.payload_digest = :digest AND o.payload_digest = ap.payload_digest
          AND {_approver("p", "ap")}
        RETURNING {APPROVAL_COLUMNS}
    ),
    cancelled AS (
        UPDATE operations AS o
        SET status = 'cancelled', fence = o.fence + 1, next_check_at = NULL,
            released_at = NULL, changed_by = :operator, change_reason = :reason,
            record_version = o.record_version + 1, updated_at = now()
        FROM upd WHERE o.id = upd.op_id AND o.status = 'prepared'
        RETURNING o.id
    ),
    decision AS (
        INSERT INTO approval_decisions (
            op_id, tenant, operator, decision, payload_digest, authorization_ref, shown, note
        )
        SELECT upd.op_id, upd.tenant, :operator, 'denied', upd.payload_digest,
               upd.authorization_ref, CAST(:shown AS jsonb), :note
        FROM upd
    )
    SELECT upd.* FROM upd
    """
)

# Why an approval or a denial changed nothing: the approval, its operation, its grant and
# the operator as they stand (the operator's columns NULL when there is no such operator).
APPROVAL_REFUSAL = text(
    f"""
    SELECT {APPROVAL_COLUMNS},
           o.status::text AS operation_status, o.payload_digest AS operation_digest,
           o.authorization_ref AS operation_grant,
           coalesce({grant_active("a")}, false) AS grant_active,
           ap.expires_at <= now() AS expired,
           p.name IS NOT NULL AS operator_known,
           coalesce({_approver("p", "ap")}, false) AS may_approve,
           coalesce({_not_the_asker("p", "ap")}, true) AS not_the_asker,
           CAST(:operator AS text) = ANY (ap.approved_by) AS approved_already
    FROM approvals AS ap
    JOIN operations AS o ON o.id = ap.op_id
    LEFT JOIN authorizations AS a ON a.ref = o.authorization_ref
    LEFT JOIN operators AS p ON p.name = :operator
    WHERE ap.op_id = :op_id
    """
)

# Pending approvals past their time, expired, their operations cancelled with the reason;
# a batch at a time, rows another sweep holds skipped.
EXPIRE_APPROVALS = text(
    """
    WITH due AS (
        SELECT op_id FROM approvals
        WHERE status = 'pending' AND expires_at <= now()
        ORDER BY expires_at
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ),
    upd AS (
        UPDATE approvals AS ap SET status = 'expired', decided_at = now()
        FROM due WHERE ap.op_id = due.op_id
        RETURNING ap.op_id, ap.expires_at, ap.approved_by, ap.approvers_required
    ),
    cancelled AS (
        UPDATE operations AS o
        SET status = 'cancelled', fence = o.fence + 1, next_check_at = NULL,
            released_at = NULL, changed_by = :actor,
            change_reason = format(
                'approval expired: %s of %s approval(s) given by %s',
                cardinality(upd.approved_by), upd.approvers_required,
                to_char(upd.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')),
            record_version = o.record_version + 1, updated_at = now()
        FROM upd WHERE o.id = upd.op_id AND o.status = 'prepared'
        RETURNING o.id
    )
    SELECT op_id FROM upd ORDER BY op_id
    """
)

# Pending requests whose operation still waits, not yet notified (`approval.requested`),
# each handed out once per backoff until `MARK_APPROVAL_NOTIFIED`; rows another sweep (or
# a decision) holds skipped.
DUE_APPROVAL_NOTIFICATIONS = text(
    """
    WITH due AS (
        SELECT ap.op_id FROM approvals AS ap JOIN operations AS o ON o.id = ap.op_id
        WHERE ap.notified_at IS NULL AND ap.status = 'pending' AND ap.expires_at > now()
          AND o.status = 'prepared'
          AND coalesce(ap.notify_due_at, ap.requested_at) <= now()
        ORDER BY ap.requested_at
        LIMIT :limit
        FOR UPDATE OF ap SKIP LOCKED
    )
    UPDATE approvals AS ap SET notify_due_at = now() + :backoff
    FROM due WHERE ap.op_id = due.op_id
    RETURNING ap.op_id
    """
)

MARK_APPROVAL_NOTIFIED = text(
    "UPDATE approvals SET notified_at = now() WHERE op_id = :op_id AND notified_at IS NULL"
)

_WITH_OPERATION = f"""
    SELECT {APPROVAL_COLUMNS}, o.status::text AS operation_status,
           o.change_reason AS operation_reason
    FROM approvals AS ap JOIN operations AS o ON o.id = ap.op_id
"""

SELECT_APPROVAL = text(f"{_WITH_OPERATION} WHERE ap.op_id = :op_id")

# Oldest first; pending ones only while their operation waits for them (prepared).
LIST_APPROVALS = text(
    f"""
    {_WITH_OPERATION}
    WHERE (CAST(:tenant AS text) IS NULL OR ap.tenant = :tenant)
      AND (CAST(:status AS text) IS NULL OR ap.status = :status)
      AND (CAST(:status AS text) IS DISTINCT FROM 'pending' OR o.status = 'prepared')
    ORDER BY ap.requested_at, ap.op_id
    LIMIT :limit
    """
)

SELECT_APPROVAL_DECISIONS = text(
    """
    SELECT id, op_id, tenant, operator, decision, payload_digest, authorization_ref, shown,
           note, at
    FROM approval_decisions WHERE op_id = :op_id ORDER BY id
    """
)

# -- who may approve: operators' `approves` (the console's accounts) ------------------------

SET_OPERATOR_APPROVES = text(
    "UPDATE operators SET approves = :approves WHERE name = :name RETURNING name, approves"
).bindparams(bindparam("approves", type_=ARRAY(Text)))

SELECT_OPERATOR_APPROVES = text("SELECT name, approves FROM operators")
SELECT_APPROVES_OF = text("SELECT approves FROM operators WHERE name = :name")
