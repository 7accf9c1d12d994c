"""fair, bounded waiting for a provider: the gate says when a slot really frees, and the
operations waiting for room are found by provider

- `opledger_admit`: a claim refused because every concurrency slot is held now says when
  the first of them frees on its own (the earliest `held_until`: the in-flight deadline of
  the call holding it), not "try again in 0.05 s". A worker defers the operation until
  then instead of polling in its task; a call that answers earlier gives its slot back and
  its outcome statement wakes the oldest operation waiting for that provider.
- `ix_operations_waiting_room`: the prepared operations deferred for their provider's room
  (`next_check_at` set), by provider and age: the outcome statement's wake-up finds the
  provider's oldest one with a few index reads, whatever the backlog of others.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03

"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _revision(name: str) -> ModuleType:
    """An earlier revision's module (its function texts)."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"opledger_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: what 0016's gate answered a full set of slots with: at most 0.05 s, whatever held them
POLL = """least(greatest(extract(epoch FROM next_at - clock_timestamp()), 0.01), 0.05)
                    ::double precision"""
#: when the first slot frees on its own (a call answering sooner wakes a waiting operation)
HORIZON = """greatest(extract(epoch FROM next_at - clock_timestamp()), 0.01)
                    ::double precision"""

# As schema.sql spells it (tests/integration/test_schema_sql.py compares the definitions).
INDEX = """
CREATE INDEX ix_operations_waiting_room ON operations USING btree (provider, created_at)
    WHERE ((status = 'prepared'::op_status) AND (next_check_at IS NOT NULL))
"""


def _admit(previous: str) -> str:
    if POLL not in previous:  # pragma: no cover - the text of 0016 is fixed
        raise AssertionError("0016's opledger_admit is not as expected")
    return previous.replace(POLL, HORIZON)


def upgrade() -> None:
    op.execute(_admit(_revision("0016_pressure_fixes.py").ADMIT))
    op.execute(INDEX)


def downgrade() -> None:
    op.execute("DROP INDEX ix_operations_waiting_room")
    op.execute(_revision("0016_pressure_fixes.py").ADMIT)
