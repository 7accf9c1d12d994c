"""Claims racing from several processes, each with its own connection pool."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.synchronize import Barrier as BarrierType

from opledger.ledger import Ledger


def _contend(url: str, op_ids: list[str], barrier: BarrierType, name: str) -> list[str]:
    ledger = Ledger.from_url(url, pool_size=1)
    won = []
    try:
        barrier.wait(timeout=30)
        for op_id in op_ids:
            if ledger.claim(op_id, owner=name) is not None:
                won.append(op_id)
    finally:
        ledger.engine.dispose()
    return won


def test_claims_racing_from_several_processes_have_one_winner_each(
    ledger: Ledger, grant: str, database_url: str
) -> None:
    op_ids = [
        ledger.prepare(
            tenant="acme",
            workflow_id="wf",
            intent_key=f"k{i}",
            action="crm.close_case.v1",
            target=f"case-{i}",
            payload={"i": i},
            authorization_ref=grant,
        ).id
        for i in range(40)
    ]
    ctx = mp.get_context("spawn")
    procs = 4
    with ctx.Manager() as manager:
        barrier = manager.Barrier(procs)
        with ctx.Pool(procs) as pool:
            results = pool.starmap(
                _contend, [(database_url, op_ids, barrier, f"p{i}") for i in range(procs)]
            )
    winners = [op for won in results for op in won]
    assert sorted(winners) == sorted(op_ids)  # every op claimed exactly once
    for op_id in op_ids:
        history = ledger.history(op_id)
        assert history.operation.fence == 1
        assert len(history.attempts) == 1
