"""operations.traceparent: the trace context of the code that prepared an operation

An opaque string (a W3C `traceparent`, as opledger's tracing writes it), stored once by
`prepare` and never read by the ledger itself: a worker that runs the operation later (a
dispatch the relay published, a reconcile the sweep handed out) links its spans back to
the trace that recorded the intent. NULL when tracing was off.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column without a default: no table rewrite, no long lock.
    op.add_column("operations", sa.Column("traceparent", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("operations", "traceparent")
