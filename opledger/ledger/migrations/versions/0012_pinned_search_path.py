"""the trigger functions pin the ledger's schema as their search_path

The ledger now lives in a schema of its own (`opledger` unless OPLEDGER_DATABASE_SCHEMA
names another). Its statements name tables unqualified and its connections set their
search_path to that schema; the trigger functions pin it too, so a change made from any
session (an application's transaction that prepares an operation, a person in psql with
the default search_path) writes the audit trail and the notifications into the ledger's
own tables, never into tables of the same name elsewhere.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: every trigger function of the ledger at this revision
FUNCTIONS = (
    "opledger_audit_transition",
    "opledger_dependency_settled",
    "opledger_guard_operation",
    "opledger_notify_review",
    "opledger_notify_settle",
)


def upgrade() -> None:
    # FROM CURRENT: the migration's own search_path, which is the ledger's schema alone
    for name in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {name}() SET search_path FROM CURRENT")


def downgrade() -> None:
    for name in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {name}() RESET search_path")
