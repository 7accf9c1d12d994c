"""initial ledger schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30

The operation ledger: operations and their frozen payloads, attempts, evidence,
transitions, reviews and authorizations, plus the trigger that keeps every status change
on the state machine and every fence growing.

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The transition guard. It mirrors opledger.ledger.models.ALLOWED_TRANSITIONS,
# so a status can only move along the state machine and a fence can only grow, whoever
# writes the row.
TRANSITION_GUARD_SQL = """
CREATE FUNCTION opledger_guard_operation() RETURNS trigger AS $$
BEGIN
    IF NEW.fence < OLD.fence THEN
        RAISE EXCEPTION 'fence of % cannot go back from % to %', OLD.id, OLD.fence, NEW.fence
            USING ERRCODE = 'OL002';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status AND NOT (
        (OLD.status, NEW.status) IN (
            ('prepared', 'dispatching'), ('prepared', 'cancelled'),
            ('dispatching', 'confirmed'), ('dispatching', 'rejected'),
            ('dispatching', 'unknown'),
            ('unknown', 'confirmed'), ('unknown', 'rejected'),
            ('unknown', 'dispatching'), ('unknown', 'cancelled')
        )
    ) THEN
        RAISE EXCEPTION 'operation % cannot move from % to %', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'OL001';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER opledger_guard_operation
    BEFORE UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION opledger_guard_operation();
"""

DROP_TRANSITION_GUARD_SQL = """
DROP TRIGGER IF EXISTS opledger_guard_operation ON operations;
DROP FUNCTION IF EXISTS opledger_guard_operation();
"""


def upgrade() -> None:
    """Upgrade schema."""
    op.create_table(
        "authorizations",
        sa.Column("ref", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("scope", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("granted_by", sa.Text(), nullable=False),
        sa.Column(
            "granted_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.Column("revoke_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("ref", name=op.f("pk_authorizations")),
    )
    op.create_index("ix_authorizations_tenant", "authorizations", ["tenant"], unique=False)
    op.create_table(
        "operations",
        sa.Column("id", sa.Text(), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("workflow_id", sa.Text(), nullable=False),
        sa.Column("intent_key", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("provider", sa.Text(), nullable=False),
        sa.Column("payload_digest", sa.Text(), nullable=False),
        sa.Column("payload_size", sa.Integer(), nullable=False),
        sa.Column("authorization_ref", sa.Text(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "prepared",
                "dispatching",
                "confirmed",
                "rejected",
                "unknown",
                "cancelled",
                name="op_status",
            ),
            server_default="prepared",
            nullable=False,
        ),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("provider_request_id", sa.Text(), nullable=False),
        sa.Column("provider_result_id", sa.Text(), nullable=True),
        sa.Column("evidence_checked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_check_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("record_version", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "id ~ '^op_[0-9A-HJKMNP-TV-Z]{26}$'", name=op.f("ck_operations_id_format")
        ),
        sa.CheckConstraint(
            "payload_digest ~ '^[0-9a-f]{64}$'", name=op.f("ck_operations_digest_format")
        ),
        sa.CheckConstraint(
            "status = 'unknown' OR (status = 'dispatching')"
            " = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name=op.f("ck_operations_lease_matches_status"),
        ),
        sa.CheckConstraint("fence >= 0", name=op.f("ck_operations_fence_nonnegative")),
        sa.ForeignKeyConstraint(
            ["authorization_ref"],
            ["authorizations.ref"],
            name=op.f("fk_operations_authorization_ref_authorizations"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operations")),
        sa.UniqueConstraint("tenant", "workflow_id", "intent_key", name="uq_operations_intent"),
    )
    op.create_index(
        "ix_operations_authorization_ref", "operations", ["authorization_ref"], unique=False
    )
    op.create_index(
        "ix_operations_due_check",
        "operations",
        ["next_check_at"],
        unique=False,
        postgresql_where=sa.text("status = 'unknown'"),
    )
    op.create_index(
        "ix_operations_prepared",
        "operations",
        ["created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'prepared'"),
    )
    op.create_index(
        "ix_operations_stale_lease",
        "operations",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'dispatching'"),
    )
    op.create_index("ix_operations_tenant_status", "operations", ["tenant", "status"], unique=False)
    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("claim_token", sa.Text(), nullable=False),
        sa.Column("provider_key", sa.Text(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("response", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("authorized_by", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IS NULL OR outcome IN ('confirmed', 'rejected', 'ambiguous')",
            name=op.f("ck_attempts_outcome_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_attempts_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("op_id", "fence", name="uq_attempts_op_fence"),
        sa.UniqueConstraint("op_id", "n", name="uq_attempts_op_n"),
    )
    op.create_table(
        "evidence",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("attempt_n", sa.Integer(), nullable=True),
        sa.Column("fence", sa.BigInteger(), nullable=True),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("verdict", sa.Text(), nullable=False),
        sa.Column(
            "binding",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "detail",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column(
            "recorded_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_evidence_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_evidence")),
    )
    op.create_index("ix_evidence_op_id", "evidence", ["op_id"], unique=False)
    op.create_table(
        "operation_payloads",
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("canonical", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_operation_payloads_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("op_id", name=op.f("pk_operation_payloads")),
    )
    op.create_table(
        "reviews",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "opened_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column(
            "snapshot",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.Column("resolved_by", sa.Text(), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_reviews_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reviews")),
    )
    op.create_index("ix_reviews_op_id", "reviews", ["op_id"], unique=False)
    op.create_index(
        "uq_reviews_one_open",
        "reviews",
        ["op_id"],
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.create_table(
        "transitions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=True), nullable=False),
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column(
            "from_status",
            sa.Enum(
                "prepared",
                "dispatching",
                "confirmed",
                "rejected",
                "unknown",
                "cancelled",
                name="op_status",
            ),
            nullable=True,
        ),
        sa.Column(
            "to_status",
            sa.Enum(
                "prepared",
                "dispatching",
                "confirmed",
                "rejected",
                "unknown",
                "cancelled",
                name="op_status",
            ),
            nullable=False,
        ),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_transitions_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_transitions")),
    )
    op.create_index("ix_transitions_op_id", "transitions", ["op_id"], unique=False)
    op.execute(TRANSITION_GUARD_SQL)


def downgrade() -> None:
    """Downgrade schema."""
    op.execute(DROP_TRANSITION_GUARD_SQL)
    op.drop_index("ix_transitions_op_id", table_name="transitions")
    op.drop_table("transitions")
    op.drop_index(
        "uq_reviews_one_open", table_name="reviews", postgresql_where=sa.text("resolved_at IS NULL")
    )
    op.drop_index("ix_reviews_op_id", table_name="reviews")
    op.drop_table("reviews")
    op.drop_table("operation_payloads")
    op.drop_index("ix_evidence_op_id", table_name="evidence")
    op.drop_table("evidence")
    op.drop_table("attempts")
    op.drop_index("ix_operations_tenant_status", table_name="operations")
    op.drop_index(
        "ix_operations_stale_lease",
        table_name="operations",
        postgresql_where=sa.text("status = 'dispatching'"),
    )
    op.drop_index(
        "ix_operations_prepared",
        table_name="operations",
        postgresql_where=sa.text("status = 'prepared'"),
    )
    op.drop_index(
        "ix_operations_due_check",
        table_name="operations",
        postgresql_where=sa.text("status = 'unknown'"),
    )
    op.drop_index("ix_operations_authorization_ref", table_name="operations")
    op.drop_table("operations")
    op.drop_index("ix_authorizations_tenant", table_name="authorizations")
    op.drop_table("authorizations")
    sa.Enum(name="op_status").drop(op.get_bind(), checkfirst=True)
