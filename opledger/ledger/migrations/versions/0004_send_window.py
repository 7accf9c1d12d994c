"""send-by window: attempts that provably sent nothing, their send-by instant; review
resolutions that override bound evidence or acknowledge a repeat risk

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Upgrade schema."""
    op.add_column("attempts", sa.Column("send_by", sa.DateTime(timezone=True), nullable=True))
    op.drop_constraint(op.f("ck_attempts_outcome_kind"), "attempts", type_="check")
    op.create_check_constraint(
        op.f("ck_attempts_outcome_kind"),
        "attempts",
        "outcome IS NULL OR outcome IN ('confirmed', 'rejected', 'ambiguous', 'not_sent')",
    )
    op.add_column(
        "review_actions",
        sa.Column(
            "override_evidence", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )
    op.add_column(
        "review_actions",
        sa.Column(
            "risk_acknowledged", sa.Boolean(), server_default=sa.text("false"), nullable=False
        ),
    )


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_column("review_actions", "risk_acknowledged")
    op.drop_column("review_actions", "override_evidence")
    op.execute("UPDATE attempts SET outcome = 'ambiguous' WHERE outcome = 'not_sent'")
    op.drop_constraint(op.f("ck_attempts_outcome_kind"), "attempts", type_="check")
    op.create_check_constraint(
        op.f("ck_attempts_outcome_kind"),
        "attempts",
        "outcome IS NULL OR outcome IN ('confirmed', 'rejected', 'ambiguous')",
    )
    op.drop_column("attempts", "send_by")
