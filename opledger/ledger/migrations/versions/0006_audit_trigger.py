"""the database writes the audit trail; one name for our idempotency key

- A trigger inserts the `transitions` row of every status or fence change (and of every
  new operation) from OLD and NEW, so the recorded `from_status` is the one the row really
  had. The statement names who made the change and why in `operations.changed_by` and
  `operations.change_reason`; the guard trigger refuses a change that does not (OL003).
- `operations.provider_request_id` and `attempts.provider_key` become `idempotency_key`,
  and evidence bindings name it the same way.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The guard of 0001, plus: a status or fence change must say who made it and why (a
# statement that forgot would otherwise leave the previous change's actor in the audit).
GUARD_TEMPLATE = """
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
{said}    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""
SAYS_WHO_AND_WHY = """\
    IF (NEW.status IS DISTINCT FROM OLD.status OR NEW.fence IS DISTINCT FROM OLD.fence)
       AND (NEW.changed_by IS NULL OR NEW.change_reason IS NULL
            OR (NEW.changed_by IS NOT DISTINCT FROM OLD.changed_by
                AND NEW.change_reason IS NOT DISTINCT FROM OLD.change_reason)) THEN
        RAISE EXCEPTION 'the change of % to % (fence %) does not say who made it and why',
            OLD.id, NEW.status, NEW.fence
            USING ERRCODE = 'OL003';
    END IF;
"""
GUARD_SQL = GUARD_TEMPLATE.replace("{said}", SAYS_WHO_AND_WHY)
GUARD_SQL_0001 = GUARD_TEMPLATE.replace("{said}", "")

AUDIT_SQL = """
CREATE FUNCTION opledger_audit_transition() RETURNS trigger AS $$
BEGIN
    INSERT INTO transitions (op_id, from_status, to_status, fence, actor, reason)
    VALUES (
        NEW.id,
        CASE WHEN TG_OP = 'UPDATE' THEN OLD.status END,
        NEW.status,
        NEW.fence,
        coalesce(NEW.changed_by, 'unknown'),
        coalesce(NEW.change_reason, NEW.status::text)
    );
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER opledger_audit_created
    AFTER INSERT ON operations
    FOR EACH ROW EXECUTE FUNCTION opledger_audit_transition();

CREATE TRIGGER opledger_audit_transition
    AFTER UPDATE OF status, fence ON operations
    FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.fence IS DISTINCT FROM NEW.fence)
    EXECUTE FUNCTION opledger_audit_transition();
"""

DROP_AUDIT_SQL = """
DROP TRIGGER IF EXISTS opledger_audit_transition ON operations;
DROP TRIGGER IF EXISTS opledger_audit_created ON operations;
DROP FUNCTION IF EXISTS opledger_audit_transition();
"""


def upgrade() -> None:
    op.alter_column("operations", "provider_request_id", new_column_name="idempotency_key")
    op.alter_column("attempts", "provider_key", new_column_name="idempotency_key")
    op.execute("ALTER TABLE operations ADD COLUMN changed_by text, ADD COLUMN change_reason text")
    op.execute(
        """
        UPDATE evidence
        SET binding = (binding - 'key') || jsonb_build_object('idempotency_key', binding -> 'key')
        WHERE binding ? 'key'
        """
    )
    op.execute(GUARD_SQL)
    op.execute(AUDIT_SQL)


def downgrade() -> None:
    op.execute(DROP_AUDIT_SQL)
    op.execute(GUARD_SQL_0001)
    op.execute(
        """
        UPDATE evidence
        SET binding = (binding - 'idempotency_key')
                      || jsonb_build_object('key', binding -> 'idempotency_key')
        WHERE binding ? 'idempotency_key'
        """
    )
    op.execute("ALTER TABLE operations DROP COLUMN changed_by, DROP COLUMN change_reason")
    op.alter_column("attempts", "idempotency_key", new_column_name="provider_key")
    op.alter_column("operations", "idempotency_key", new_column_name="provider_request_id")
