"""send-by window: each attempt's send-by instant; review resolutions that override bound
evidence or acknowledge that a retry may repeat the effect

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
    op.drop_column("attempts", "send_by")
