"""payload encryption at rest (placeholder: filled by the payload encryption change)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

"""

from collections.abc import Sequence

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
