"""approvals: a person approves the exact effect, once, before anything is sent

An action's approval policy may require a person (or two) to approve an act before it is
sent. The act is recorded and frozen as any other, and waits: an approval row, written in
the transaction that records it, binds the request to the operation, its frozen payload's
digest and its grant, and holds the operation (`waiting_on` + 1) until the last approval
needed releases it. The claim takes an operation with an approval only when that approval
is approved for exactly its payload digest and grant, and the first claim consumes it
(`consumed_at`, `consumed_fence`). `approval_decisions` keeps every decision: who, when,
the digest they were shown and the payload as shown (secrets hidden). An operator approves
the actions their `approves` patterns cover (none until given).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# As schema.sql spells them (tests/integration/test_schema_sql.py compares the catalog).
APPROVES = "ALTER TABLE operators ADD COLUMN approves text[] DEFAULT '{}'::text[] NOT NULL"

APPROVALS = """
CREATE TABLE approvals (
    op_id text NOT NULL,
    tenant text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    payload_digest text NOT NULL,
    authorization_ref text NOT NULL,
    requested_by text NOT NULL,
    asked_by text,
    reasons text[] DEFAULT '{}'::text[] NOT NULL,
    approvers_required smallint NOT NULL,
    approved_by text[] DEFAULT '{}'::text[] NOT NULL,
    status text DEFAULT 'pending'::text NOT NULL,
    requested_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    decided_by text,
    consumed_at timestamp with time zone,
    consumed_fence bigint,
    CONSTRAINT ck_approvals_status CHECK ((status = ANY (ARRAY['pending'::text,
        'approved'::text, 'denied'::text, 'expired'::text]))),
    CONSTRAINT ck_approvals_approvers CHECK (((approvers_required >= 1)
        AND (approvers_required <= 2))),
    CONSTRAINT ck_approvals_consumed_once CHECK (((consumed_at IS NULL)
        = (consumed_fence IS NULL))),
    CONSTRAINT ck_approvals_consumed_approved CHECK (((consumed_at IS NULL)
        OR (status = 'approved'::text)))
);
ALTER TABLE ONLY approvals ADD CONSTRAINT pk_approvals PRIMARY KEY (op_id);
ALTER TABLE ONLY approvals
    ADD CONSTRAINT fk_approvals_op_id_operations FOREIGN KEY (op_id)
        REFERENCES operations(id) ON DELETE CASCADE;
CREATE INDEX ix_approvals_pending ON approvals USING btree (tenant, requested_at)
    WHERE (status = 'pending'::text);
CREATE INDEX ix_approvals_expiring ON approvals USING btree (expires_at)
    WHERE (status = 'pending'::text);

CREATE TABLE approval_decisions (
    id bigint GENERATED ALWAYS AS IDENTITY,
    op_id text NOT NULL,
    tenant text NOT NULL,
    operator text NOT NULL,
    decision text NOT NULL,
    payload_digest text NOT NULL,
    authorization_ref text NOT NULL,
    shown jsonb NOT NULL,
    note text,
    at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT ck_approval_decisions_decision CHECK ((decision = ANY (ARRAY['approved'::text,
        'denied'::text])))
);
ALTER TABLE ONLY approval_decisions ADD CONSTRAINT pk_approval_decisions PRIMARY KEY (id);
ALTER TABLE ONLY approval_decisions
    ADD CONSTRAINT fk_approval_decisions_op_id_approvals FOREIGN KEY (op_id)
        REFERENCES approvals(op_id) ON DELETE CASCADE;
CREATE INDEX ix_approval_decisions_op_id ON approval_decisions USING btree (op_id);
"""


def upgrade() -> None:
    op.execute(APPROVES)
    op.execute(APPROVALS)


def downgrade() -> None:
    # an operation still held for its approval would be claimable once the table is gone
    # (its hold, waiting_on, stays; nothing releases it): refused while one waits
    op.execute(
        """
        DO $$
        BEGIN
            IF EXISTS (SELECT 1 FROM approvals AS a JOIN operations AS o ON o.id = a.op_id
                       WHERE a.status = 'pending' AND o.status = 'prepared') THEN
                RAISE EXCEPTION 'operations wait for approvals, which revision 0021 cannot '
                    'hold: decide them (opledger approvals) or keep 0022';
            END IF;
        END
        $$
        """
    )
    op.execute("DROP TABLE approval_decisions")
    op.execute("DROP TABLE approvals")
    op.execute("ALTER TABLE operators DROP COLUMN approves")
