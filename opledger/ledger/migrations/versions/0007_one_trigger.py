"""one trigger per status change: the guard writes the audit row itself

Until now a status or fence change ran two PL/pgSQL triggers: the guard (BEFORE UPDATE,
on every update of an operation) and the audit (AFTER UPDATE, queued until the end of the
statement). The guard now also inserts the `transitions` row, and it fires only when the
status or the fence changes (`BEFORE UPDATE OF status, fence ... WHEN`), so a worker's claim
and outcome each run one trigger function instead of two, and an update that touches
neither column (relay, check schedule) runs none. The audit row is written from the same
OLD and NEW as before, after the same checks; a refused change still writes nothing.
New operations keep their AFTER INSERT audit trigger (the row must exist first).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GUARD_AND_AUDIT_SQL = """
CREATE OR REPLACE FUNCTION opledger_guard_operation() RETURNS trigger AS $$
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
    IF NEW.changed_by IS NULL OR NEW.change_reason IS NULL
       OR (NEW.changed_by IS NOT DISTINCT FROM OLD.changed_by
           AND NEW.change_reason IS NOT DISTINCT FROM OLD.change_reason) THEN
        RAISE EXCEPTION 'the change of % to % (fence %) does not say who made it and why',
            OLD.id, NEW.status, NEW.fence
            USING ERRCODE = 'OL003';
    END IF;
    INSERT INTO transitions (op_id, from_status, to_status, fence, actor, reason)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.fence, NEW.changed_by, NEW.change_reason);
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER opledger_audit_transition ON operations;
DROP TRIGGER opledger_guard_operation ON operations;
CREATE TRIGGER opledger_guard_operation
    BEFORE UPDATE OF status, fence ON operations
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.fence IS DISTINCT FROM NEW.fence)
    EXECUTE FUNCTION opledger_guard_operation();
"""

# 0006 as it shipped: the guard on every update, the audit after each status or fence change.
GUARD_0006_SQL = """
CREATE OR REPLACE FUNCTION opledger_guard_operation() RETURNS trigger AS $$
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
    IF (NEW.status IS DISTINCT FROM OLD.status OR NEW.fence IS DISTINCT FROM OLD.fence)
       AND (NEW.changed_by IS NULL OR NEW.change_reason IS NULL
            OR (NEW.changed_by IS NOT DISTINCT FROM OLD.changed_by
                AND NEW.change_reason IS NOT DISTINCT FROM OLD.change_reason)) THEN
        RAISE EXCEPTION 'the change of % to % (fence %) does not say who made it and why',
            OLD.id, NEW.status, NEW.fence
            USING ERRCODE = 'OL003';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER opledger_guard_operation ON operations;
CREATE TRIGGER opledger_guard_operation
    BEFORE UPDATE ON operations
    FOR EACH ROW EXECUTE FUNCTION opledger_guard_operation();
CREATE TRIGGER opledger_audit_transition
    AFTER UPDATE OF status, fence ON operations
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.fence IS DISTINCT FROM NEW.fence)
    EXECUTE FUNCTION opledger_audit_transition();
"""


def upgrade() -> None:
    op.execute(GUARD_AND_AUDIT_SQL)


def downgrade() -> None:
    op.execute(GUARD_0006_SQL)
