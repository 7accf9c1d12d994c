"""The Celery integration with real processes: workers, beat, Redis, Postgres, providers."""

from __future__ import annotations

import signal

import httpx
import pytest

from opledger.dev.chaos.audit import in_flight_races
from opledger.dev.processes import PrivateRedis, Proc, Stack, free_port, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.tasks.app import dispatch
from tests.forks import ForkedProc
from tests.intents import key_of, prepare

from .conftest import settled, worker_with

pytestmark = pytest.mark.system


def requests_for(sandbox: Sandbox, ledger: Ledger, op_id: str) -> list[dict[str, float]]:
    """Every request the CRM admitted under the operation's key."""
    return list(sandbox.truth()["requests"].get(f"crm:{key_of(ledger, op_id)}", []))


def effects_of(sandbox: Sandbox, ledger: Ledger, op_id: str) -> int:
    """How many times the CRM applied the operation's key."""
    return sandbox.effects(f"crm:{key_of(ledger, op_id)}")


def assert_never_sent_while_in_flight(ledger: Ledger, sandbox: Sandbox, op_id: str) -> None:
    """No request for the operation reached the provider before the previous attempt's
    in-flight deadline had passed."""
    history = ledger.history(op_id)
    assert in_flight_races(history, requests_for(sandbox, ledger, op_id)) == 0


def test_a_delayed_operation_is_confirmed_with_one_effect(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    op_id = prepare(sys_ledger, "close")
    dispatch.delay(op_id)
    assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
    assert effects_of(sandbox, sys_ledger, op_id) == 1


def test_the_same_id_delivered_five_times_at_once_has_one_effect(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    sandbox.configure(processing_s=0.3)
    op_ids = [prepare(sys_ledger, f"k{i}", target=f"case-{i}") for i in range(3)]
    for op_id in op_ids:
        for _ in range(5):
            dispatch.delay(op_id)
    assert set(settled(sys_ledger, op_ids).values()) == {Status.CONFIRMED}
    for op_id in op_ids:
        assert effects_of(sandbox, sys_ledger, op_id) == 1
        assert len(requests_for(sandbox, sys_ledger, op_id)) == 1
        assert len(sys_ledger.history(op_id).attempts) == 1


def test_a_worker_killed_while_dispatching_is_reconciled_not_resent(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    sandbox.configure(processing_s=1.5)  # the provider is slow: we kill mid-call
    op_id = prepare(sys_ledger, "close")
    dispatch.delay(op_id)
    wait_until(
        lambda: requests_for(sandbox, sys_ledger, op_id), 15, "the provider to receive the call"
    )
    running.kill_worker("w1")  # SIGKILL, main process and pool children
    assert sys_ledger.get(op_id).status is Status.DISPATCHING
    running.start_worker("w1")
    assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
    history = sys_ledger.history(op_id)
    assert [t.reason for t in history.transitions if t.to_status is Status.UNKNOWN] == [
        "lease expired"
    ]
    assert effects_of(sandbox, sys_ledger, op_id) == 1
    assert_never_sent_while_in_flight(sys_ledger, sandbox, op_id)


def test_a_stalled_worker_is_fenced_out_and_its_late_outcome_kept(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    sandbox.configure(processing_s=0.8)
    # one pool process, busy with this call when it is stopped: a second one could be
    # stopped mid-sweep, holding the maintenance locks every other worker's sweep waits for
    with worker_with(running, "stalled", concurrency=1) as stalled:
        op_id = prepare(sys_ledger, "close")
        dispatch.delay(op_id)
        wait_until(
            lambda: requests_for(sandbox, sys_ledger, op_id), 15, "the provider to receive the call"
        )
        stalled.signal(signal.SIGSTOP)
        try:
            helper = running.start_worker("w2")
            # the lease (3 s) expires, the sweep fences the stalled worker out, w2 reconciles
            wait_until(
                lambda: sys_ledger.get(op_id).status is Status.CONFIRMED,
                30,
                "reconciliation by the second worker",
            )
        finally:
            stalled.signal(signal.SIGCONT)
        fence_after = sys_ledger.get(op_id).fence

        def late_evidence() -> bool:
            return any(
                e.source == "dispatch" and not e.applied for e in sys_ledger.history(op_id).evidence
            )

        wait_until(late_evidence, 20, "the stalled worker's late outcome")
    after = sys_ledger.get(op_id)
    assert after.status is Status.CONFIRMED and after.fence == fence_after
    late = [e for e in sys_ledger.history(op_id).evidence if e.source == "dispatch"]
    assert [(e.fence, e.applied) for e in late] == [(1, False)]
    assert effects_of(sandbox, sys_ledger, op_id) == 1
    assert isinstance(helper, Proc)


def test_messages_lost_in_a_redis_restart_are_relayed(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox, private_redis: PrivateRedis
) -> None:
    running.kill_worker("w1")
    op_ids = [prepare(sys_ledger, f"k{i}", target=f"case-{i}") for i in range(6)]
    for op_id in op_ids:
        dispatch.delay(op_id)
    assert private_redis.queued("dispatch") >= 6
    private_redis.restart()
    assert private_redis.queued("dispatch") == 0
    running.start_worker("w1")
    assert set(settled(sys_ledger, op_ids, timeout=45).values()) == {Status.CONFIRMED}
    for op_id in op_ids:
        assert effects_of(sandbox, sys_ledger, op_id) == 1


def test_flower_lists_the_worker_and_the_opledger_tasks(running: Stack, sys_ledger: Ledger) -> None:
    port = free_port()
    env = {**running.env, "OPLEDGER_FLOWER_PASSWORD": "test-only"}
    flower = ForkedProc(
        "flower", ["flower", "--port", str(port)], env, running.workdir / "flower.log"
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(base), 30, "flower to listen")
        assert httpx.get(f"{base}/api/workers").status_code == 401  # basic auth is on
        op_id = prepare(sys_ledger, "close")
        dispatch.delay(op_id)
        settled(sys_ledger, [op_id])

        def workers() -> dict[str, object]:
            r = httpx.get(
                f"{base}/api/workers",
                params={"refresh": "1"},
                auth=("opledger", "test-only"),
                timeout=10,
            )
            return r.json() if r.status_code == 200 else {}

        found = wait_until(workers, 30, "flower to see the worker")
        (info,) = [v for k, v in found.items() if k.startswith("w1@")]
        registered = set(info["registered"])
        assert {
            "opledger.dispatch",
            "opledger.reconcile",
            "opledger.sweep",
            "opledger.relay",
            "opledger.purge_payloads",
        } <= registered

        def tasks() -> dict[str, dict[str, object]]:
            r = httpx.get(f"{base}/api/tasks", auth=("opledger", "test-only"), timeout=10)
            return r.json() if r.status_code == 200 else {}

        def dispatch_seen() -> list[dict[str, object]]:
            return [t for t in tasks().values() if t.get("name") == "opledger.dispatch"]

        dispatch.delay(op_id)  # a redelivery Flower sees after it connected
        seen = wait_until(dispatch_seen, 30, "flower to see a dispatch task")
        # the broker carries the operation id only: no payload, no customer data
        assert all(op_id in str(t.get("args")) and "resolved" not in str(t) for t in seen)
    finally:
        flower.kill()


def _answers(base: str) -> bool:
    try:
        httpx.get(base, timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_the_beat_is_exclusive(running: Stack) -> None:
    first = running.beat
    assert first is not None
    wait_until(lambda: "Scheduler: Sending due task" in first.output(), 30, "the first beat")
    second = ForkedProc("beat2", ["beat"], running.env, running.workdir / "beat2.log")
    try:
        assert second.wait(timeout=30) == 4  # operational: exactly one beat may run
        assert "another opledger beat" in second.output()
    finally:
        second.kill()  # already gone when the test passes
