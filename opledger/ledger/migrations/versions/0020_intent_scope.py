"""intent scope: one act whatever run asks

An operation's intent was unique per (tenant, workflow_id, intent_key): one act per run.
Some acts are one act whatever run or agent of the tenant asks (refunding a charge,
closing a case). This revision records each operation's `intent_scope` — `run` (every
operation so far, and the default) or `tenant` — and makes a tenant-wide act unique in its
tenant: `uq_operations_tenant_intent` on (tenant, intent_key) of the operations of the
tenant's scope, whose keys have a form of their own (`<action>:tenant:<digest>`) that no
run's key takes. `uq_operations_intent` stays as it was for every operation; the run that
asked a tenant-wide act first is its `workflow_id`.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells them (tests/integration/test_schema_sql.py compares the catalog).
COLUMN = """
ALTER TABLE operations ADD COLUMN intent_scope text DEFAULT 'run'::text NOT NULL,
    ADD CONSTRAINT ck_operations_intent_scope
        CHECK ((intent_scope = ANY (ARRAY['run'::text, 'tenant'::text])))
"""
INDEX = """
CREATE UNIQUE INDEX uq_operations_tenant_intent ON operations USING btree (tenant, intent_key)
    WHERE (intent_scope = 'tenant'::text)
"""


def upgrade() -> None:
    op.execute(COLUMN)
    op.execute(INDEX)


def downgrade() -> None:
    # a tenant-wide act keeps its operation (unique in its run as every operation is); what
    # made it one act across runs goes
    op.execute("DROP INDEX uq_operations_tenant_intent")
    op.execute(
        "ALTER TABLE operations DROP CONSTRAINT ck_operations_intent_scope, "
        "DROP COLUMN intent_scope"
    )
