"""The in-memory twin of the ledger (`dev.memory.MemoryLedger`, what `tests/unit/test_worker.py`
runs the worker on) and the Postgres `Ledger` agree on a worker's path: the same short
scenario, run by the same `Worker` on both, leaves the same statuses, fences, attempts and
evidence, and both refuse the same stale writes."""

from __future__ import annotations

from typing import Any

import pytest

from opledger.dev.memory import MemoryLedger
from opledger.ledger import Confirmed, Ledger, StaleFence, Status
from opledger.ledger.facades import WorkerLedger
from opledger.tasks.worker import Worker, WorkerConfig
from tests.workerrig import LEASE, Rig


def _scenario(rig: Rig, ledger: WorkerLedger) -> list[Any]:
    """Dispatches answered, refused and lost, a reconcile, and stale writes; what each
    operation went through."""
    worker = Worker(ledger, rig.registry, owner="w1", config=WorkerConfig(lease=LEASE))
    grant = ledger.grant(tenant="acme", scope=["crm.*"], granted_by="test", ref="auth_twin").ref

    def prepare(case: str) -> str:
        return ledger.prepare(
            tenant="acme",
            workflow_id="twin",
            intent_key=f"close-{case}",
            action="crm.close_case.v1",
            target=case,
            payload={"note": "done"},
            authorization_ref=grant,
        ).id

    ops = [prepare(case) for case in ("answered", "refused", "lost", "stale")]
    for op_id, mode in zip(ops[:3], ("ok", "refuse", "lost"), strict=True):
        rig.crm.mode = mode
        worker.dispatch(op_id)
    rig.crm.mode = "ok"
    steps = [worker.reconcile(ops[2]).action.value]

    stale = ops[3]
    claim = ledger.claim(stale, owner="w1", terms=rig.registry.claim_terms(LEASE))
    assert claim is not None
    receipt = Confirmed(receipt_id="r1")
    ledger.record_outcome(claim, receipt)
    refused = []
    with pytest.raises(StaleFence) as again:  # a second report under the same claim
        ledger.record_outcome(claim, receipt)
    refused.append(again.value.fields.get("evidence_kept"))
    assert ledger.claim_retry(stale, owner="w2", expected_fence=claim.fence - 1) is None
    with pytest.raises(StaleFence):
        ledger.settle(
            stale, fence=claim.fence, to=Status.REJECTED, evidence_id=1, actor="w", reason="r"
        )
    with pytest.raises(StaleFence):
        ledger.schedule_check(stale, fence=claim.fence - 1, at=claim.started_at)

    seen: list[Any] = [steps, refused]  # refused: whether a second report kept evidence
    for op_id in ops:
        history = ledger.history(op_id)
        seen.append(
            {
                "status": history.operation.status.value,
                "fence": history.operation.fence,
                "transitions": [
                    (t.from_status, t.to_status.value, t.fence) for t in history.transitions
                ],
                "attempts": [(a.n, a.fence, a.outcome) for a in history.attempts],
                "evidence": [
                    (e.source.value, e.verdict.value, e.applied, e.fence) for e in history.evidence
                ],
            }
        )
    return seen


def test_the_twin_and_postgres_agree_on_a_workers_path(ledger: Ledger) -> None:
    on_postgres, in_memory = Rig(), Rig()
    postgres = Ledger(ledger.engine, actions=on_postgres.registry)
    twin = MemoryLedger(on_postgres.registry.provider_for)
    assert _scenario(on_postgres, postgres) == _scenario(in_memory, twin)
    assert on_postgres.crm.applied == in_memory.crm.applied == 2  # answered, lost
