"""A worker frozen (SIGSTOP) between its claim and its send wakes up after its send-by
window and sends nothing, for every provider-contract kind.

The frozen worker's children stop themselves at `dispatch.before_call` (right after the
claim committed, before the adapter is called). The sweeper fences them out, and once
their attempts' in-flight deadlines have passed another worker retries where the
contract allows it. Half of the frozen processes are resumed (SIGCONT) while those
retries are executing at the provider, the other half after they finished. None of the
providers answers a concurrent request with a conflict, and one has no deduplication
but an authoritative status API, so a late request would show in the ground truth as a
second effect or an overlap.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest

from opledger.dev.chaos.audit import audit, effect_key
from opledger.dev.chaos.variants import ALL_KINDS, EMAIL_ACCOUNT, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import History, Ledger, Status
from opledger.tasks.app import dispatch
from tests.intents import prepare

from .conftest import settings_of, settled, worker_with

pytestmark = pytest.mark.system

ACTIONS = [kind.action for kind in ALL_KINDS] + ["email.send.v1", "email.smtp_send.v1"]
#: a request executes for PROCESSING_S at the provider, inside the 3 s timeout and the
#: 4 s in-flight bound the contracts declare; the lease is shorter than the window
# Any, not str: unpacked into start_worker(), whose concurrency is an int
ENV: dict[str, Any] = {
    "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "3",
    "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "4",
    "OPLEDGER_LEASE_SECONDS": "2",
}
PROCESSING_S = 2.5
#: the kinds whose contract allows a retry once the frozen attempt's deadline has passed
RETRIED = {
    "crm.close_case.v1",
    "crmk.close_case.v1",
    "crml.close_case.v1",  # keyed with a status API, behind its limits
    "crmx.close_case.v1",
    "email.send.v1",
}


def _ops(ledger: Ledger, tag: str) -> list[str]:
    ids = []
    for i, action in enumerate(ACTIONS):
        if action.startswith("email."):
            payload: dict[str, Any] = {"to": "owner@acme.test", "subject": "Closed", "text": tag}
            target = "owner@acme.test"
        else:
            payload, target = {"note": f"{tag} {i}"}, f"case-{tag}-{i}"
        ids.append(prepare(ledger, f"{tag}-{i}", action=action, target=target, payload=payload))
    return ids


def _requests(sandbox: Sandbox, history: History) -> list[dict[str, Any]]:
    return list(sandbox.truth()["requests"].get(effect_key(history), []))


def _in_review(history: History) -> bool:
    return any(r.resolved_at is None for r in history.reviews)


def _pid(history: History) -> int:
    return int(history.attempts[0].owner.rsplit(":", 1)[1])


def _resume(ledger: Ledger, op_ids: list[str]) -> float:
    at = time.time()
    for op_id in op_ids:
        os.kill(_pid(ledger.history(op_id)), signal.SIGCONT)
    return at


def test_a_worker_frozen_between_claim_and_send_never_sends_after_its_window(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    configure_sandbox(sandbox, settings_of({**running.env, **ENV}))
    for account in [kind.account for kind in ALL_KINDS] + [EMAIL_ACCOUNT]:
        sandbox.configure(account=account, processing_s=PROCESSING_S)
    with worker_with(
        running,
        "frozen",
        concurrency=2 * len(ACTIONS),
        OPLEDGER_CRASHPOINT="dispatch.before_call",
        OPLEDGER_CRASHPOINT_SIGNAL="SIGSTOP",
        **ENV,
    ):
        during, after = _ops(sys_ledger, "during"), _ops(sys_ledger, "after")
        everything = during + after
        for op_id in everything:
            dispatch.delay(op_id)
        wait_until(
            lambda: all(sys_ledger.history(o).attempts for o in everything),
            45,
            "every operation claimed by a frozen process",
        )
        running.start_worker("w1", **ENV)

        # Resume the first half each while its retry is executing at the provider (or
        # once it is in review, where the contract allows no retry).
        overlapped: list[str] = []
        pending = set(during)
        give_up = time.monotonic() + 45
        while pending:
            assert time.monotonic() < give_up, f"no retry began for {pending}"
            for op_id in sorted(pending):
                h = sys_ledger.history(op_id)
                executing = len(h.attempts) >= 2 and any(
                    r["completed"] is None for r in _requests(sandbox, h)
                )
                if executing or _in_review(h) or h.operation.status.final:
                    _resume(sys_ledger, [op_id])
                    pending.discard(op_id)
                    if executing:
                        overlapped.append(h.operation.action)
            time.sleep(0.05)
        assert set(overlapped) == RETRIED, "every retry should have been executing at resume"

        # Resume the second half after the retries finished.
        def retry_done(op_id: str) -> bool:
            h = sys_ledger.history(op_id)
            return _in_review(h) or h.operation.status is Status.CONFIRMED

        wait_until(lambda: all(retry_done(o) for o in after), 45, "retries to finish")
        _resume(sys_ledger, after)

        wait_until(
            lambda: all(sys_ledger.history(o).attempts[0].finished_at for o in everything),
            30,
            "the resumed processes to record their attempts",
        )
        settled(sys_ledger, everything, timeout=60)

    result = audit(sys_ledger, sandbox.truth(), everything)
    assert result.clean, result.problems
    assert result.duplicate_effects == 0 and result.dispatches_while_in_flight == 0
    for op_id in everything:
        history = sys_ledger.history(op_id)
        frozen = history.attempts[0]
        op = history.operation
        assert frozen.outcome == "ambiguous" and frozen.response is not None, frozen
        assert frozen.response["code"] == "not_sent", (op.action, frozen.response)
        assert frozen.response["detail"]["why"] == "window_passed", frozen.response
        requests = _requests(sandbox, history)
        # every request the provider saw came from a later attempt, none from the frozen one
        assert len(requests) == len(history.attempts) - 1, (op.action, requests)
        assert all(r["arrived"] >= history.attempts[1].started_at.timestamp() for r in requests)
        if op.action in RETRIED:
            assert op.status is Status.CONFIRMED, (op.action, op.status)
        else:  # nothing proves it was never sent while the frozen attempt was open
            assert op.status is Status.UNKNOWN and _in_review(history), op.action
    assert sys_ledger.list(status=[Status.DISPATCHING, Status.PREPARED]) == ()


def test_a_call_that_outlives_its_lease_settles_as_soon_as_it_answers(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    """The provider takes longer than the lease: the sweeper fences the worker out, its
    success comes back and is kept as evidence, and the operation is confirmed at once,
    not at the check scheduled for the attempt's in-flight deadline."""
    env = {
        "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "5",
        "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "8",
        "OPLEDGER_LEASE_SECONDS": "1.5",
    }
    configure_sandbox(sandbox, settings_of({**running.env, **env}))
    slow = [kind for kind in ALL_KINDS if kind.name in ("keyed+status", "no-dedup")]
    for kind in slow:
        sandbox.configure(account=kind.account, processing_s=3.5)
    with worker_with(running, concurrency=len(slow) + 2, **env):  # room for sweeps
        op_ids = [
            prepare(sys_ledger, f"slow-{i}", action=kind.action, target=f"case-slow-{i}")
            for i, kind in enumerate(slow)
        ]
        for op_id in op_ids:
            dispatch.delay(op_id)
        settled(sys_ledger, op_ids, timeout=30)
    for op_id in op_ids:
        history = sys_ledger.history(op_id)
        assert history.operation.status is Status.CONFIRMED
        reasons = [t.reason for t in history.transitions]
        assert "lease expired" in reasons  # it really was fenced out
        (attempt,) = history.attempts
        confirmed_at = history.transitions[-1].at
        # well before the check the in-flight deadline would have scheduled (13 s)
        assert confirmed_at < attempt.deadline_at - timedelta(seconds=3), (
            confirmed_at,
            attempt.deadline_at,
        )
    assert audit(sys_ledger, sandbox.truth(), op_ids).clean
