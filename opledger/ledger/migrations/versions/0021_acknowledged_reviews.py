"""acknowledged: the resolution of a settled operation's review

A review used to hold an unknown operation only. A fresh success on a same-key resend
after an attempt that may have applied (from a provider that marks its replays) confirms
the operation and opens a review of a possible duplicate, which a person resolves as
`acknowledged`: the operation stays confirmed, and the audit row keeps who, when and what
they found. This revision lets `review_actions` record that resolution.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells it (tests/integration/test_schema_sql.py compares the catalog).
CHECK = """
ALTER TABLE review_actions
    ADD CONSTRAINT ck_review_actions_resolution_kind CHECK ((resolution = ANY (
        ARRAY['confirmed'::text, 'rejected'::text, 'retry'::text, 'cancel'::text,
              'acknowledged'::text])))
"""


def upgrade() -> None:
    op.execute("ALTER TABLE review_actions DROP CONSTRAINT ck_review_actions_resolution_kind")
    op.execute(CHECK)


def downgrade() -> None:
    # the older constraint cannot spell an acknowledgement, and no other resolution means
    # what it did (the operation stayed confirmed): refused while one is on record
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM review_actions WHERE resolution = 'acknowledged') THEN
                RAISE EXCEPTION 'review_actions holds acknowledged resolutions, which '
                    'revision 0020 cannot record: keep 0021';
            END IF;
        END
        $$
        """
    )
    op.execute("ALTER TABLE review_actions DROP CONSTRAINT ck_review_actions_resolution_kind")
    op.execute(
        "ALTER TABLE review_actions ADD CONSTRAINT ck_review_actions_resolution_kind CHECK "
        "((resolution = ANY (ARRAY['confirmed'::text, 'rejected'::text, 'retry'::text, "
        "'cancel'::text])))"
    )
