"""Break the worker at every named crash point with a real SIGKILL, for every provider
contract kind, then restart it and let the sweeper and the reconciler finish.

Each test runs one operation per contract kind (keyed with a status API, keyed without a
lookup, search only, no dedup at all — none of them with in-flight protection) plus the
email API and SMTP, and asserts on the providers' ground truth and the final ledger:
no effect applied twice, no request sent while an earlier attempt could be in flight,
every operation confirmed, rejected, cancelled or unknown with an open review; none stuck,
none lost.

Every test runs on Redis. On RabbitMQ (a private vhost, see conftest) one representative
window runs by default — the kill after the provider applied the effect, before the outcome
was saved — and the whole file with OPLEDGER_TEST_RABBITMQ=all (or select them with
`-m rabbitmq`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest

from opledger.adapters.smtp import message_id_for
from opledger.dev.chaos.audit import audit
from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import IntentConflict, Ledger, Status
from opledger.tasks.app import dispatch
from tests.intents import key_of, prepare

from .conftest import crashes, settings_of, settled, worker_with

pytestmark = [pytest.mark.system, pytest.mark.long]

ACTIONS = [kind.action for kind in KINDS] + ["email.send.v1", "email.smtp_send.v1"]


@dataclass
class Window:
    point: str
    fault: str | None  # a provider fault on each operation's first request
    crashes: int  # how many crashes to wait for before restarting
    publish: bool = True  # False: leave the messages to the beat relay


WINDOWS = [
    Window("dispatch.after_claim", None, crashes=len(ACTIONS)),
    Window("dispatch.before_call", None, crashes=len(ACTIONS)),
    Window("dispatch.after_call", None, crashes=len(ACTIONS)),
    Window("dispatch.after_save", None, crashes=len(ACTIONS)),
    # ambiguous first attempts, so reconciliation (and its lookups) run and crash
    Window("reconcile.before_lookup", "drop_after_commit", crashes=1),
    Window("reconcile.after_lookup", "drop_after_commit", crashes=1),
    Window("relay.after_publish", None, crashes=1, publish=False),
]


def _ops(ledger: Ledger, tag: str) -> list[str]:
    ids = []
    for i, action in enumerate(ACTIONS):
        payload = {"note": f"{tag} {i}"}
        target = f"case-{i}"
        if action.startswith("email."):
            payload = {"to": "owner@acme.test", "subject": "Case closed", "text": tag}
            target = "owner@acme.test"
        ids.append(prepare(ledger, f"{tag}-{i}", action=action, target=target, payload=payload))
    return ids


def _fault_first_requests(sandbox: Sandbox, ledger: Ledger, op_ids: list[str], mode: str) -> None:
    """A fault on each operation's first request, matched by what the provider receives:
    the Message-ID over SMTP, the operation's idempotency key elsewhere."""
    for op_id in op_ids:
        op = ledger.get(op_id)
        if op.action.startswith("email.smtp"):
            sandbox.fault("smtp", "drop_after_data", key=message_id_for(op))
        elif op.action.startswith("email."):
            sandbox.fault("email", mode, key=op.idempotency_key)
        else:
            sandbox.fault("crm", mode, key=op.idempotency_key)


#: the window that runs on RabbitMQ in the default suite
REPRESENTATIVE = "dispatch.after_call"
RABBITMQ_ALL = os.environ.get("OPLEDGER_TEST_RABBITMQ") == "all"
OPT_IN = pytest.mark.skipif(
    not RABBITMQ_ALL, reason="on RabbitMQ only with OPLEDGER_TEST_RABBITMQ=all (suite budget)"
)


def _on(broker: str, opt_in: bool) -> pytest.MarkDecorator | list[pytest.MarkDecorator]:
    if broker == "redis":
        return []
    return [pytest.mark.rabbitmq, OPT_IN] if opt_in else [pytest.mark.rabbitmq]


#: every other test of this file: on Redis, and on RabbitMQ when opted in
BROKERS = ["redis", pytest.param("rabbitmq", marks=_on("rabbitmq", opt_in=True))]
CASES = [
    pytest.param(w, broker, id=f"{w.point}-{broker}", marks=_on(broker, w.point != REPRESENTATIVE))
    for broker in ("redis", "rabbitmq")
    for w in WINDOWS
]


@pytest.mark.parametrize(("window", "broker"), CASES)
def test_crash_point(
    window: Window, broker: str, running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    url = running.env["OPLEDGER_BROKER_URL"]
    assert url.startswith("amqp://" if broker == "rabbitmq" else "redis://")
    assert dispatch.app.conf.broker_url == url  # this process publishes there too
    configure_sandbox(sandbox, settings_of(running.env))
    with worker_with(running, "crashy", concurrency=1, OPLEDGER_CRASHPOINT=window.point) as crashy:
        op_ids = _ops(sys_ledger, window.point)
        if window.fault:
            _fault_first_requests(sandbox, sys_ledger, op_ids, window.fault)
        if window.publish:
            for op_id in op_ids:
                dispatch.delay(op_id)
        wait_until(
            lambda: crashes(crashy) >= window.crashes,
            75,  # up to six pool restarts: slow while the suite's other process is busy
            f"{window.crashes} crashes at {window.point}",
        )
        assert f"Connected to {url.split('://')[0]}://" in crashy.output()
    settled(sys_ledger, op_ids, timeout=60)  # by the plain w1, started again
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean, result.problems
    assert result.ops == len(ACTIONS)
    assert not sys_ledger.list(status=[Status.DISPATCHING, Status.PREPARED])
    if window.point == "dispatch.after_save":  # saved before the crash: nothing to recover
        assert result.confirmed == len(ACTIONS)


@pytest.mark.parametrize("broker", BROKERS)
def test_two_workers_resume_the_same_operation_together(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    from opledger.tasks.app import reconcile

    configure_sandbox(sandbox, settings_of(running.env))
    running.start_worker("w2")
    op_ids = _ops(sys_ledger, "together")
    _fault_first_requests(sandbox, sys_ledger, op_ids, "drop_after_commit")
    for op_id in op_ids:
        dispatch.delay(op_id)
    wait_until(
        lambda: all(sys_ledger.get(o).status is not Status.PREPARED for o in op_ids), 20, "dispatch"
    )
    for _ in range(6):  # both workers take reconcile messages for the same operations
        for op_id in op_ids:
            reconcile.delay(op_id)
    settled(sys_ledger, op_ids, timeout=60)
    result = audit(sys_ledger, sandbox.truth(), op_ids)
    assert result.clean, result.problems
    running.kill_worker("w2")


@pytest.mark.parametrize("broker", BROKERS)
def test_a_provider_key_expiring_between_attempts_goes_to_review(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    env: dict[str, Any] = {
        "OPLEDGER_KEY_RETENTION_SECONDS": "2",
        "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "2",
    }
    settings = settings_of({**running.env, **env})
    configure_sandbox(sandbox, settings)
    with worker_with(running, **env):
        keyed = next(k for k in KINDS if k.name == "keyed")
        op_id = prepare(sys_ledger, "expiring", action=keyed.action)
        key = key_of(sys_ledger, op_id)
        sandbox.fault("crm", "drop_after_commit", key=key)
        dispatch.delay(op_id)
        settled(sys_ledger, [op_id], timeout=30)
        history = sys_ledger.history(op_id)
        assert history.operation.status is Status.UNKNOWN
        assert "keeps keys" in history.reviews[0].reason
        assert audit(sys_ledger, sandbox.truth(), [op_id]).clean
        assert len(sandbox.truth()["requests"][f"crm:{key}"]) == 1


@pytest.mark.parametrize("broker", BROKERS)
def test_a_changed_payload_under_the_same_intent_is_refused(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    op_id = prepare(sys_ledger, "notify", payload={"note": "first"})
    with pytest.raises(IntentConflict):
        prepare(sys_ledger, "notify", payload={"note": "changed"})
    dispatch.delay(op_id)
    assert settled(sys_ledger, [op_id]) == {op_id: Status.CONFIRMED}
    assert sys_ledger.payload(op_id) == {"note": "first"}
    assert sandbox.effects(f"crm:{key_of(sys_ledger, op_id)}") == 1


@pytest.mark.parametrize("broker", BROKERS)
def test_delayed_search_visibility_keeps_it_unknown_for_review(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    search = next(k for k in KINDS if k.name == "search")
    sandbox.configure(account=search.account, search_lag_s=60.0)  # far behind the contract
    op_id = prepare(sys_ledger, "lagging", action=search.action)
    key = key_of(sys_ledger, op_id)
    sandbox.fault("crm", "drop_after_commit", key=key)
    dispatch.delay(op_id)
    settled(sys_ledger, [op_id], timeout=30)
    history = sys_ledger.history(op_id)
    assert history.operation.status is Status.UNKNOWN and history.reviews
    assert [e.verdict for e in history.evidence if e.source == "lookup"] == ["inconclusive"]
    assert sandbox.effects(f"crm:{key}") == 1
    assert history.reviews[0].resolved_at is None  # a person has it, and nothing was retried


@pytest.mark.parametrize("broker", BROKERS)
def test_a_worker_killed_mid_call_never_races_the_call_still_in_flight(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    """The provider is still executing when the lease expires: the sweeper fences the dead
    worker out at once, but no kind may send again before the in-flight deadline."""
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    env: dict[str, Any] = {
        "OPLEDGER_PROVIDER_TIMEOUT_SECONDS": "5",
        "OPLEDGER_LEASE_SECONDS": "5.5",
        "OPLEDGER_PROVIDER_IN_FLIGHT_SECONDS": "8",
    }
    settings = settings_of({**running.env, **env})
    configure_sandbox(sandbox, settings)
    for kind in KINDS:
        sandbox.configure(account=kind.account, processing_s=6.5)  # longer than the lease
    with worker_with(running, concurrency=len(KINDS), **env):  # every call at once
        op_ids = [
            prepare(sys_ledger, f"slow-{kind.name}", action=kind.action, target=f"case-{i}")
            for i, kind in enumerate(KINDS)
        ]
        keys = [key_of(sys_ledger, op_id) for op_id in op_ids]
        for op_id in op_ids:
            dispatch.delay(op_id)
        wait_until(
            lambda: all(sandbox.truth()["requests"].get(f"crm:{k}") for k in keys),
            20,
            "every call to reach the provider",
        )
        running.kill_worker("w1")  # SIGKILL mid-call
        running.start_worker("w1", **env)
        settled(sys_ledger, op_ids, timeout=60)
        result = audit(sys_ledger, sandbox.truth(), op_ids)
        assert result.clean, result.problems
        for op_id in op_ids:
            reasons = [t.reason for t in sys_ledger.history(op_id).transitions]
            assert "lease expired" in reasons
