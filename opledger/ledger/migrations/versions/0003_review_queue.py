"""review queue: operator retries, notifications, views and the resolution audit trail

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "review_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("review_id", sa.BigInteger(), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("resolution", sa.Text(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=True),
        sa.Column("new_key", sa.Text(), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("shown", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.CheckConstraint(
            "resolution IN ('confirmed', 'rejected', 'retry', 'cancel')",
            name=op.f("ck_review_actions_resolution_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_review_actions_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["review_id"],
            ["reviews.id"],
            name=op.f("fk_review_actions_review_id_reviews"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_actions")),
    )
    op.create_index("ix_review_actions_op_id", "review_actions", ["op_id"], unique=False)
    op.create_table(
        "review_views",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("review_id", sa.BigInteger(), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("record_version", sa.Integer(), nullable=False),
        sa.Column("shown", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "shown_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["review_id"],
            ["reviews.id"],
            name=op.f("fk_review_views_review_id_reviews"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_review_views")),
    )
    op.create_index(
        "ix_review_views_review_operator", "review_views", ["review_id", "operator"], unique=False
    )
    op.add_column("operations", sa.Column("operator_retry_by", sa.Text(), nullable=True))
    op.add_column("reviews", sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("reviews", sa.Column("notify_due_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_reviews_to_notify",
        "reviews",
        ["notify_due_at"],
        unique=False,
        postgresql_where=sa.text("notified_at IS NULL AND resolved_at IS NULL"),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_index(
        "ix_reviews_to_notify",
        table_name="reviews",
        postgresql_where=sa.text("notified_at IS NULL AND resolved_at IS NULL"),
    )
    op.drop_column("reviews", "notify_due_at")
    op.drop_column("reviews", "notified_at")
    op.drop_column("operations", "operator_retry_by")
    op.drop_index("ix_review_views_review_operator", table_name="review_views")
    op.drop_table("review_views")
    op.drop_index("ix_review_actions_op_id", table_name="review_actions")
    op.drop_table("review_actions")
