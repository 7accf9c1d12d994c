"""intent_asks: who asked for each intent of an agent's effect, and what they asked

One row per ask through `Ledger.ask` (what `opledger.agents` calls): the ask that recorded
the operation and every later one for the same intent (a model asked again, a replayed
tool call, a lost response asked again under a new id), with the asker's tool-call or
request id, the digest of the payload it asked with, its authorization, and which parts
of the recorded intent it asked differently (nothing of those was sent). Append-only
evidence of who asked; never part of the operation's identity.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "intent_asks",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column(
            "asked_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("asked_by", sa.Text(), nullable=True),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("payload_digest", sa.Text(), nullable=False),
        sa.Column("authorization_ref", sa.Text(), nullable=False),
        sa.Column(
            "differs",
            postgresql.ARRAY(sa.Text()),
            server_default=sa.text("'{}'::text[]"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_intent_asks_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intent_asks")),
    )
    op.create_index("ix_intent_asks_op_id", "intent_asks", ["op_id"])


def downgrade() -> None:
    op.drop_index("ix_intent_asks_op_id", table_name="intent_asks")
    op.drop_table("intent_asks")
