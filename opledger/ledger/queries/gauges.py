"""What the ledger's gauges read when Prometheus scrapes (`observability.ledger_gauges`),
and who holds the beat's lock (the gauges and `opledger check`): each served by an index
whose size is the backlog, or by the catalog, never a count of the whole history."""

from __future__ import annotations

from sqlalchemy import text

#: the statuses an operation is still open in, counted per scrape
OPEN_STATUSES = ("prepared", "dispatching", "unknown")

# One branch per status, each matching a partial index's predicate (ix_operations_prepared,
# ix_operations_stale_lease, ix_operations_due_check): the planner reads only those rows.
BY_STATUS_AND_ACTION = text(
    " UNION ALL ".join(
        f"(SELECT '{status}' AS status, action, count(*) AS n, "
        "EXTRACT(EPOCH FROM now() - min(created_at)) AS oldest "
        f"FROM operations WHERE status = '{status}' GROUP BY action)"
        for status in OPEN_STATUSES
    )
)

OPEN_REVIEWS = text(
    "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(opened_at)), 0) "
    "FROM reviews WHERE resolved_at IS NULL"
)

# Served by the partial index of pending requests (ix_approvals_pending): never the history
PENDING_APPROVALS = text(
    "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(requested_at)), 0) "
    "FROM approvals WHERE status = 'pending'"
)

#: Postgres's own estimate of the operations table's rows (free)
ESTIMATED_ROWS = text(
    "SELECT GREATEST(reltuples, 0)::bigint FROM pg_class WHERE oid = 'operations'::regclass"
)

#: the ledger's newest epoch, its newest switch, its forgotten orphan receipts and the
#: synchronous standbys its commits wait for (-1: the role may not see them)
DURABILITY = text(
    """
    SELECT (SELECT epoch FROM ledger_epochs ORDER BY epoch DESC LIMIT 1),
           (SELECT coalesce(EXTRACT(EPOCH FROM max(began_at)), 0) FROM ledger_epochs
            WHERE kind <> 'initial'),
           (SELECT count(*) FROM orphan_receipts WHERE matched_op_id IS NULL AND forgotten),
           CASE WHEN current_setting('synchronous_standby_names') = ''
                     OR current_setting('synchronous_commit') NOT IN
                        ('on', 'remote_write', 'remote_apply') THEN 0
                WHEN EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state IS NULL)
                     AND NOT EXISTS (SELECT 1 FROM pg_stat_replication
                                     WHERE sync_state IN ('sync', 'quorum')) THEN -1
                ELSE (SELECT count(*) FROM pg_stat_replication
                      WHERE sync_state IN ('sync', 'quorum')) END
    """
)

#: the backend holding the beat's advisory lock (`pgschema.lock_words`: :hi, :lo), or no
#: row; advisory locks are per database: a beat of another database on the same server is
#: none of ours
BEAT_LOCK_HOLDER = text(
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND classid = :hi AND objid = :lo AND objsubid = 1 "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
