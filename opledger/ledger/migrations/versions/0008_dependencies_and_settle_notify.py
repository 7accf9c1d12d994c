"""ordered effects and settle notifications

- `operation_deps`: an operation may name operations it runs after (`prepare(after=...)`).
  `operations.waiting_on` counts the ones not confirmed yet; the claim takes only an
  operation with `waiting_on = 0` (one predicate in CLAIM). A trigger keeps the counter:
  when a dependency is confirmed, its dependents' counters go down (and a dependent whose
  counter reaches 0 gets `released_at`, so the relay publishes it at once); when a
  dependency is rejected or cancelled, its prepared dependents are cancelled with that
  reason (and theirs in turn). Only operations with `has_dependents` fire it.
- `operations.notify_settle`: set for operations an agent waits on (`opledger.agents`).
  A trigger sends `NOTIFY opledger_settle, '<op id>'` in the transaction that changes the
  status (or the dependency counter) of such an operation, or opens a review on it, so a
  waiting agent wakes up when that transaction commits. Other operations pay nothing.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TRIGGERS_SQL = """
CREATE FUNCTION opledger_dependency_settled() RETURNS trigger AS $$
BEGIN
    IF NEW.status = 'confirmed' THEN
        UPDATE operations AS o
        SET waiting_on = o.waiting_on - 1,
            released_at = CASE WHEN o.waiting_on = 1 THEN now() ELSE o.released_at END,
            updated_at = now()
        FROM operation_deps AS d
        WHERE d.dep_id = NEW.id AND o.id = d.op_id AND o.status = 'prepared';
    ELSE
        UPDATE operations AS o
        SET status = 'cancelled', fence = o.fence + 1, next_check_at = NULL,
            released_at = NULL,
            changed_by = 'dependency',
            change_reason = format('dependency %s was %s (%s)', NEW.id, NEW.status,
                                   coalesce(NEW.change_reason, 'no reason given')),
            record_version = o.record_version + 1, updated_at = now()
        FROM operation_deps AS d
        WHERE d.dep_id = NEW.id AND o.id = d.op_id AND o.status = 'prepared';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER opledger_dependency_settled
    AFTER UPDATE OF status ON operations
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.status IS DISTINCT FROM NEW.status
          AND NEW.status IN ('confirmed', 'rejected', 'cancelled'))
    EXECUTE FUNCTION opledger_dependency_settled();

CREATE FUNCTION opledger_notify_settle() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('opledger_settle', NEW.id);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER opledger_notify_settle
    AFTER UPDATE OF status, waiting_on ON operations
    FOR EACH ROW
    WHEN ((NEW.notify_settle OR NEW.has_dependents)
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.waiting_on IS DISTINCT FROM NEW.waiting_on)
          AND NEW.status <> 'dispatching')
    EXECUTE FUNCTION opledger_notify_settle();

CREATE FUNCTION opledger_notify_review() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('opledger_settle', o.id)
    FROM operations AS o
    WHERE o.id = NEW.op_id AND (o.notify_settle OR o.has_dependents);
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER opledger_notify_review
    AFTER INSERT ON reviews
    FOR EACH ROW EXECUTE FUNCTION opledger_notify_review();
"""

DROP_TRIGGERS_SQL = """
DROP TRIGGER IF EXISTS opledger_notify_review ON reviews;
DROP FUNCTION IF EXISTS opledger_notify_review();
DROP TRIGGER IF EXISTS opledger_notify_settle ON operations;
DROP FUNCTION IF EXISTS opledger_notify_settle();
DROP TRIGGER IF EXISTS opledger_dependency_settled ON operations;
DROP FUNCTION IF EXISTS opledger_dependency_settled();
"""


def upgrade() -> None:
    op.add_column(
        "operations",
        sa.Column("waiting_on", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column(
        "operations",
        sa.Column("has_dependents", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column(
        "operations",
        sa.Column("notify_settle", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.add_column("operations", sa.Column("released_at", sa.DateTime(timezone=True)))
    op.create_check_constraint("ck_operations_waiting_nonnegative", "operations", "waiting_on >= 0")
    op.create_table(
        "operation_deps",
        sa.Column("op_id", sa.Text(), nullable=False),
        sa.Column("dep_id", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["op_id"],
            ["operations.id"],
            name=op.f("fk_operation_deps_op_id_operations"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["dep_id"], ["operations.id"], name=op.f("fk_operation_deps_dep_id_operations")
        ),
        sa.PrimaryKeyConstraint("op_id", "dep_id", name=op.f("pk_operation_deps")),
    )
    op.create_index("ix_operation_deps_dep_id", "operation_deps", ["dep_id"])
    op.execute(TRIGGERS_SQL)


def downgrade() -> None:
    op.execute(DROP_TRIGGERS_SQL)
    op.drop_index("ix_operation_deps_dep_id", table_name="operation_deps")
    op.drop_table("operation_deps")
    op.drop_constraint("ck_operations_waiting_nonnegative", "operations", type_="check")
    op.drop_column("operations", "released_at")
    op.drop_column("operations", "notify_settle")
    op.drop_column("operations", "has_dependents")
    op.drop_column("operations", "waiting_on")
