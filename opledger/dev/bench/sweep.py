"""The sweeps' cost at 10k and 1M operations, with their query plans."""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

from sqlalchemy import text
from sqlalchemy.orm import Session

from opledger.ledger import Ledger

from .apps import ACTION
from .config import BenchConfig

FILL = """
INSERT INTO operations (id, tenant, workflow_id, intent_key, action, target, provider,
                        payload_digest, payload_size, authorization_ref, status, fence,
                        idempotency_key, created_at, updated_at)
SELECT 'op_' || upper(lpad(to_hex(i), 26, '0')), 'bench', 'fill', 'k' || i, 'bench.noop.v1',
       't' || i, 'bench', repeat('a', 64), 2, 'auth_bench', 'confirmed', 2,
       'op_' || upper(lpad(to_hex(i), 26, '0')), now() - interval '1 day', now() - interval '1 day'
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) AS i
"""

# Put the stale rows back before each timed sweep: expired leases, due checks, unclaimed.
RESTALE = """
ALTER TABLE operations DISABLE TRIGGER USER;
UPDATE operations SET status = 'dispatching', lease_token = 'x', lease_owner = 'gone',
       lease_expires_at = now() - interval '1 minute', next_check_at = NULL,
       changed_by = 'bench', change_reason = 'made stale'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'lease-');
UPDATE operations SET status = 'unknown', lease_token = NULL, lease_expires_at = NULL,
       next_check_at = now() - interval '1 minute'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'due-');
UPDATE operations SET status = 'prepared', enqueued_at = NULL,
       created_at = now() - interval '1 hour'
 WHERE tenant = 'bench-stale' AND starts_with(intent_key, 'relay-');
ALTER TABLE operations ENABLE TRIGGER USER;
"""

PLANS = {
    "expire_leases": "SELECT id FROM operations WHERE status = 'dispatching' "
    "AND lease_expires_at < now() ORDER BY lease_expires_at LIMIT 500",
    "due_checks": "SELECT id FROM operations WHERE status = 'unknown' "
    "AND next_check_at <= now() ORDER BY next_check_at LIMIT 500",
    "relay": "SELECT id FROM operations WHERE status = 'prepared' "
    "AND created_at < now() - interval '1 minute' ORDER BY created_at LIMIT 500",
}


def sweep_cost(
    ledger: Ledger, size: int, cfg: BenchConfig, filled: int
) -> tuple[float, dict[str, str]]:
    """Median ms of one full sweep (expire + due + relay) with `size` rows in the ledger."""
    with ledger.engine.begin() as conn:
        # history filler: no audit rows (they are not what a sweep reads)
        conn.exec_driver_sql("ALTER TABLE operations DISABLE TRIGGER USER")
        for start in range(filled + 1, size + 1, 200_000):
            conn.execute(text(FILL), {"start": start, "stop": min(size, start + 199_999)})
        conn.exec_driver_sql("ALTER TABLE operations ENABLE TRIGGER USER")
        conn.exec_driver_sql("ANALYZE operations")
    timings = []
    for _ in range(cfg.repeats):
        with ledger.engine.begin() as conn:
            conn.exec_driver_sql(RESTALE)
        started = time.perf_counter()
        ledger.expire_leases(limit=500, backoff=timedelta(seconds=30))
        ledger.due_checks(limit=500, backoff=timedelta(seconds=30))
        ledger.relay(older_than=timedelta(minutes=1), publish=lambda _op, _gen: None, limit=500)
        timings.append((time.perf_counter() - started) * 1000)
    plans = {}
    with ledger.engine.begin() as conn:
        conn.exec_driver_sql(RESTALE)
        for name, sql in PLANS.items():
            rows = conn.exec_driver_sql(f"EXPLAIN {sql}").all()
            plans[name] = " / ".join(r[0].strip() for r in rows)
    return statistics.median(timings), plans


def make_stale(ledger: Ledger, n: int) -> None:
    ledger.grant(tenant="bench-stale", scope=["bench.*"], granted_by="bench", ref="auth_stale")
    for kind in ("lease", "due", "relay"):
        for i in range(n):
            ledger.prepare(
                tenant="bench-stale",
                workflow_id="stale",
                intent_key=f"{kind}-{i}",
                action=ACTION,
                target=f"s-{i}",
                payload={"i": i},
                authorization_ref="auth_stale",
            )


def prepare_rates(ledger: Ledger, n: int) -> dict[str, float]:
    ledger.grant(tenant="bench-prep", scope=["bench.*"], granted_by="bench", ref="auth_prep")

    def one(i: int, prefix: str, session: Session | None = None) -> None:
        ledger.prepare(
            tenant="bench-prep",
            workflow_id=prefix,
            intent_key=f"k{i}",
            action=ACTION,
            target=f"t{i}",
            payload={"i": i, "note": "a small payload"},
            authorization_ref="auth_prep",
            session=session,
        )

    started = time.perf_counter()
    for i in range(n):
        one(i, "alone")
    alone = n / (time.perf_counter() - started)
    started = time.perf_counter()
    batch = 100
    for first in range(0, n, batch):
        with Session(ledger.engine) as session:
            for i in range(first, min(n, first + batch)):
                one(i, "in-tx", session)
            session.commit()
    in_tx = n / (time.perf_counter() - started)
    return {"prepare_ops_s": alone, "prepare_in_tx_ops_s": in_tx}
