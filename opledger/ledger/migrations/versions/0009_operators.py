"""operators of the review console: accounts (argon2 hashes), tenant scope, sessions

- `operators`: one row per person who may use `opledger console`. A password hash
  (argon2id, from `opledger operator add`), or none for an account that only signs in
  through a trusted SSO proxy header. An operator acts for the tenants listed, or for every
  tenant (`all_tenants`); never for none. Disabling keeps the row (the audit trail names it).
- `console_sessions`: server-side sessions. The cookie carries a random token; only its
  sha256 is stored, with the session's CSRF token, its absolute expiry and when it was last
  used (the idle timeout is counted from there).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "operators",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=True),
        sa.Column("all_tenants", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "tenants",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("disabled_by", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "all_tenants OR cardinality(tenants) > 0", name=op.f("ck_operators_has_tenants")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_operators")),
    )
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("operator", sa.Text(), nullable=False),
        sa.Column("csrf_token", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["operator"],
            ["operators.name"],
            name=op.f("fk_console_sessions_operator_operators"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_console_sessions")),
    )
    op.create_index("ix_console_sessions_operator", "console_sessions", ["operator"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_console_sessions_operator", table_name="console_sessions")
    op.drop_table("console_sessions")
    op.drop_table("operators")
