"""approval notices: each approval request is notified once

An approval request is notified to the review webhook (`approval.requested`, a
notification that is an operation of its own, prepared once per request). The sweep hands
out the pending requests not yet notified, each once per backoff (`notify_due_at`), until
the notification is prepared (`notified_at`), as it does for reviews.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells them (tests/integration/test_schema_sql.py compares the catalog).
COLUMNS = """
ALTER TABLE approvals
    ADD COLUMN notified_at timestamp with time zone,
    ADD COLUMN notify_due_at timestamp with time zone
"""
INDEX = """
CREATE INDEX ix_approvals_unnotified ON approvals USING btree (requested_at)
    WHERE ((notified_at IS NULL) AND (status = 'pending'::text))
"""


def upgrade() -> None:
    op.execute(COLUMNS)
    op.execute(INDEX)


def downgrade() -> None:
    op.execute("DROP INDEX ix_approvals_unnotified")
    op.execute("ALTER TABLE approvals DROP COLUMN notify_due_at, DROP COLUMN notified_at")
