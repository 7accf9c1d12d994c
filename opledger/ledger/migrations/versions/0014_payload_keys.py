"""frozen payloads encrypted at rest: a key id and the sealed bytes beside the clear text

A payload row is either in clear (`canonical`, `key_id` NULL: written before any key was
configured) or sealed (`key_id` and `sealed`, AES-256-GCM bound to the operation's id,
`canonical` NULL), never both. Existing rows stay in clear until `opledger payloads
rotate` seals them.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "operation_payloads"
CHECK = "ck_operation_payloads_sealed_or_clear"


def upgrade() -> None:
    op.alter_column(TABLE, "canonical", existing_type=sa.Text(), nullable=True)
    op.add_column(TABLE, sa.Column("key_id", sa.Text(), nullable=True))
    op.add_column(TABLE, sa.Column("sealed", sa.LargeBinary(), nullable=True))
    op.create_check_constraint(
        op.f(CHECK),
        TABLE,
        "(key_id IS NULL AND sealed IS NULL AND canonical IS NOT NULL)"
        " OR (key_id IS NOT NULL AND sealed IS NOT NULL AND canonical IS NULL)",
    )


def downgrade() -> None:
    sealed = op.get_bind().execute(
        sa.text(f"SELECT count(*) FROM {TABLE} WHERE key_id IS NOT NULL")
    )
    count = sealed.scalar_one()
    if count:
        # the migration holds no key: dropping the columns would lose these payloads
        raise RuntimeError(
            f"{count} frozen payloads are encrypted: revision 0013 cannot hold them; purge "
            "them or keep revision 0014"
        )
    op.drop_constraint(op.f(CHECK), TABLE, type_="check")
    op.drop_column(TABLE, "sealed")
    op.drop_column(TABLE, "key_id")
    op.alter_column(TABLE, "canonical", existing_type=sa.Text(), nullable=False)
