"""beat liveness: the beat's heartbeat

Without beat nothing relays, sweeps or reconciles, and nothing said so: `opledger check`
saw only that no beat held the lock. This revision gives the running beat one row to
write from its scheduler's loop (`opledger.tasks.beat.Scheduler`), every few seconds:
who (host, pid), since when, and when it was last seen ticking. `opledger check`, the
workers, the metrics and the agents' answers read it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells it (tests/integration/test_schema_sql.py compares the catalog).
TABLE = """
-- The beat's heartbeat (migration 0018): one row, written by the running beat's scheduler
-- loop every few seconds; `seen_at` is the database's time of its last tick. No row: no
-- beat has run against this ledger (or not since the row was removed).
CREATE TABLE beat_heartbeat (
    id integer DEFAULT 1 NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    started_at timestamp with time zone NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_beat_heartbeat_one_row CHECK ((id = 1))
);
ALTER TABLE ONLY beat_heartbeat ADD CONSTRAINT pk_beat_heartbeat PRIMARY KEY (id);
"""


def upgrade() -> None:
    op.execute(TABLE)


def downgrade() -> None:
    op.execute("DROP TABLE beat_heartbeat")
