"""The beat's heartbeat (migration 0018): written by the running beat's scheduler loop, read
by `opledger check`, the workers' watcher, the metrics and the agents' answers. One row,
read by its primary key: as cheap as a statement gets."""

from __future__ import annotations

from sqlalchemy import text

# The running beat's tick: who it is, since when, and now (the database's clock, so no
# host's clock skew makes a beat look stale or fresh). A beat that starts replaces the row
# of the one before it.
BEAT_HEARTBEAT = text(
    """
    INSERT INTO beat_heartbeat (id, host, pid, started_at, seen_at)
    VALUES (1, :host, :pid, :started_at, now())
    ON CONFLICT (id) DO UPDATE
    SET host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = EXCLUDED.started_at,
        seen_at = EXCLUDED.seen_at
    """
)

# The last beat seen, and the database's time now (one row, also when no beat ever ran).
BEAT_SEEN = text(
    """
    SELECT h.host, h.pid, h.started_at, h.seen_at, now() AS db_now
    FROM (SELECT 1) AS one LEFT JOIN beat_heartbeat AS h ON h.id = 1
    """
)
