"""Epochs, switches, orphan receipts and the replication the ledger runs on."""

from __future__ import annotations

from sqlalchemy import text

#: the CTE every claim and outcome statement starts with: the newest epoch, the server's
#: timeline and WAL positions, and whether the ledger is still what this process saw of it
#: (`opledger_epoch_check`); nothing is written where it is not
FRESH = """fresh AS (
        SELECT * FROM opledger_epoch_check(
            CAST(:seen_epoch AS bigint), CAST(:seen_timeline AS integer),
            CAST(:seen_lsn AS pg_lsn), CAST(:wal AS boolean))
    )"""

SELECT_KEY_NAMESPACE = text("SELECT key_namespace FROM ledger_identity WHERE id = 1")

#: whether this server lets its timeline and WAL position be read (a probe, once a process)
PROBE_WAL = text(
    "SELECT opledger_timeline() AS timeline, CAST(pg_current_wal_flush_lsn() AS text) AS flushed"
)

EPOCH_COLUMNS = """epoch, kind, timeline, previous_timeline, began_at, lsn, seen_lsn,
    detected_by, reason, fence_floor, quarantined, suspect_until, ended_by"""

RECORD_SWITCH = text(
    f"""
    SELECT {EPOCH_COLUMNS}, CAST(pg_current_wal_flush_lsn() AS text) AS flushed,
           kind <> 'initial' AND began_at = now() AS made
    FROM opledger_switch(
        :by, CAST(:seen_epoch AS bigint), CAST(:seen_timeline AS integer),
        CAST(:seen_lsn AS pg_lsn), CAST(:holds AS jsonb), :hold, :suspect, :lossless)
    """
)

QUARANTINE_ONE = text(
    """
    SELECT opledger_quarantine(:op_id, (SELECT max(epoch) FROM ledger_epochs), :by,
                               CAST(:holds AS jsonb), :hold)
    """
)

LIST_EPOCHS = text(f"SELECT {EPOCH_COLUMNS} FROM ledger_epochs ORDER BY epoch DESC LIMIT :limit")

NEWEST_EPOCH = text(f"SELECT {EPOCH_COLUMNS} FROM ledger_epochs ORDER BY epoch DESC LIMIT 1")

# An operator ends a switch's suspicion window early: operations prepared from now on are
# first-dispatched as usual (those prepared before stay suspect).
END_SUSPICION = text(
    f"""
    UPDATE ledger_epochs SET suspect_until = least(suspect_until, now()), ended_by = :by
    WHERE epoch = :epoch AND kind <> 'initial'
    RETURNING {EPOCH_COLUMNS}
    """
)

ORPHAN_COLUMNS = """id, received_at, op_id, tenant, workflow_id, intent_key, action, target,
    payload_digest, idempotency_key, fence, attempt_n, claim_epoch, ledger_epoch, forgotten,
    why, reported_by, verdict, binding, detail, matched_op_id, matched_at"""

# A provider's answer to a claim the ledger has no record of, kept (never dropped). A
# forgotten one (its claim was issued in an older epoch) is tied to its operation now if
# the operation is known and not prepared; else when it is found or asked again.
INSERT_ORPHAN = text(
    """
    WITH orphan AS (
        INSERT INTO orphan_receipts (
            op_id, tenant, workflow_id, intent_key, action, target, payload_digest,
            idempotency_key, fence, attempt_n, claim_epoch, ledger_epoch, forgotten, why,
            reported_by, verdict, binding, detail
        )
        VALUES (
            :op_id, :tenant, :workflow_id, :intent_key, :action, :target, :payload_digest,
            :idempotency_key, :fence, :attempt_n, :claim_epoch,
            (SELECT max(epoch) FROM ledger_epochs), :forgotten, :why, :reported_by, :verdict,
            CAST(:binding AS jsonb), CAST(:detail AS jsonb)
        )
        RETURNING *
    ),
    target_op AS (
        SELECT o.id FROM operations AS o, orphan
        WHERE orphan.forgotten AND o.status <> 'prepared'
          AND (o.id = orphan.op_id
               OR (o.tenant = orphan.tenant AND o.workflow_id = orphan.workflow_id
                   AND o.intent_key = orphan.intent_key))
        ORDER BY (o.id = orphan.op_id) DESC, o.id DESC
        LIMIT 1
    ),
    tied AS (
        UPDATE orphan_receipts AS r SET matched_op_id = t.id, matched_at = now()
        FROM target_op AS t, orphan
        WHERE r.id = orphan.id
        RETURNING r.id, t.id AS to_op
    ),
    kept AS (
        INSERT INTO evidence (op_id, attempt_n, fence, source, verdict, binding, detail, applied)
        SELECT tied.to_op, NULL, orphan.fence, 'dispatch', orphan.verdict, orphan.binding,
               orphan.detail || jsonb_build_object(
                   'orphan_receipt', orphan.id, 'received_at', orphan.received_at,
                   'orphan', 'the provider''s answer to a claim the ledger forgot'),
               false
        FROM tied, orphan
        RETURNING op_id
    ),
    touched AS (
        UPDATE operations AS o
        SET evidence_checked_at = now(), updated_at = now(), record_version = o.record_version + 1,
            next_check_at = CASE WHEN o.status = 'unknown' THEN now() ELSE o.next_check_at END
        FROM kept WHERE o.id = kept.op_id
        RETURNING o.id, o.status::text AS status
    )
    SELECT orphan.id, orphan.ledger_epoch, (SELECT id FROM touched) AS tied_to,
           (SELECT status FROM touched) AS status
    FROM orphan
    """
)

LIST_ORPHANS = text(
    f"""
    SELECT {ORPHAN_COLUMNS} FROM orphan_receipts
    WHERE (NOT CAST(:unmatched AS boolean) OR matched_op_id IS NULL)
      AND (CAST(:tenant AS text) IS NULL OR tenant = :tenant)
    ORDER BY id DESC LIMIT :limit
    """
)

# What replication the ledger's session commits under: its own synchronous_commit, the
# server's synchronous_standby_names, and the standbys the server streams to (their
# sync_state is shown only to a role with pg_read_all_stats, pg_monitor or superuser).
REPLICATION = text(
    """
    SELECT current_setting('synchronous_commit') AS synchronous_commit,
           current_setting('synchronous_standby_names') AS synchronous_standby_names,
           pg_is_in_recovery() AS in_recovery,
           coalesce((SELECT jsonb_agg(jsonb_build_object(
                         'name', application_name, 'state', state, 'sync_state', sync_state)
                         ORDER BY application_name)
                     FROM pg_stat_replication), '[]'::jsonb) AS standbys
    """
)
