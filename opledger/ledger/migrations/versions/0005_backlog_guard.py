"""backlog guard: publish generations per operation and one guard row per queue

operations.relay_gen counts the relay's re-publications of a prepared operation (its
backoff doubles with each), operations.check_gen the checks handed to reconcile; both
travel in the message so a superseded duplicate can be dropped. queue_guards keeps, per
broker queue, the last depth sample and the measured drain rate, so republishing holds
while the queue is deeper than the workers drain in one interval.

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "operations",
        sa.Column("relay_gen", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "operations",
        sa.Column("check_gen", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "queue_guards",
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("depth_after", sa.BigInteger(), nullable=True),
        sa.Column("counter", sa.BigInteger(), nullable=True),
        sa.Column("drain_per_s", sa.Float(), server_default=sa.text("0"), nullable=False),
        sa.Column("shallow_since", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("queue", name=op.f("pk_queue_guards")),
    )


def downgrade() -> None:
    op.drop_table("queue_guards")
    op.drop_column("operations", "check_gen")
    op.drop_column("operations", "relay_gen")
