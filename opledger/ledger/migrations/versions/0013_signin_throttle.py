"""console sign-in throttling: every password check recorded; a session's one-time notice

- `signin_attempts`: one row per password check the console ran (the name as typed,
  known or not, the client's address, whether it succeeded). Failures counted per name
  since its last success, and per address, make the console refuse further attempts for
  a while, in every console process alike; `opledger operator audit NAME` lists them.
- `console_sessions.flash`: what the next page of the session says once (a resolution
  just made), kept on the server rather than in a URL anyone can craft.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signin_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_signin_attempts")),
    )
    op.create_index("ix_signin_attempts_operator_at", "signin_attempts", ["operator", "at"])
    op.create_index("ix_signin_attempts_address_at", "signin_attempts", ["address", "at"])
    op.add_column(
        "console_sessions",
        sa.Column("flash", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("console_sessions", "flash")
    op.drop_index("ix_signin_attempts_address_at", table_name="signin_attempts")
    op.drop_index("ix_signin_attempts_operator_at", table_name="signin_attempts")
    op.drop_table("signin_attempts")
