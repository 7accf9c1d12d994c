"""Nothing an operation holds can stop the fleet (issue 29): an operation prepared through a
ledger that does not know the adapters, with a mistyped action, leaves every worker and the
beat starting and the other operations flowing. The worker holds it — nothing sent, no
review — and it is visible: one warning line in the worker's log, `opledger check`'s
warning, and the `opledger_operations_unserved` gauge."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
from functools import partial

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from opledger.adapters.registry import load_registry
from opledger.dev.processes import Proc, Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.observability.server import make_server
from opledger.tasks.app import dispatch
from tests.intents import key_of, prepare

from .conftest import settings_of, settled

pytestmark = pytest.mark.system

TYPO = "crm.close_cse.v1"  # meant: crm.close_case.v1
AUTH = {"Authorization": "Basic " + base64.b64encode(b"prom:s3cret").decode()}


def unserved_gauge(ledger: Ledger, served: tuple[str, ...]) -> dict[str, float]:
    server = make_server(ledger.engine, user="prom", password="s3cret", port=0, actions=served)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        body = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", headers=AUTH).text
    finally:
        server.shutdown()
        server.server_close()
    return {
        s.labels["action"]: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name == "opledger_operations_unserved"
    }


def warned_at_start(proc: Proc) -> str | None:
    output = proc.output()
    return output if "warning: actions:" in output else None


def test_a_mistyped_action_is_held_while_the_restarted_worker_confirms_the_rest(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    bare = Ledger(sys_ledger.engine)  # as Ledger.from_url(url): any well-formed action
    typo = prepare(bare, "typo", action=TYPO)

    # a deploy or a supervisor restart now: the worker and the beat come up all the same
    running.kill_worker("w1")
    worker = running.start_worker("w1")  # raises if it exits (it used to: exit 4)
    beat = running.start_beat()
    for proc in (worker, beat):
        output = wait_until(partial(warned_at_start, proc), 30, f"{proc.name}'s start-up warning")
        assert f"open operations name actions no adapter serves: {TYPO} (1 operation)" in output
    wait_until(lambda: "beat: Starting" in beat.output(), 30, "the beat to start")
    assert beat.proc.poll() is None
    # dispatched once the new worker is up (a worker killed just after claiming it would
    # leave an attempt with no outcome, which is another story: the crash windows')
    dispatch.delay(typo)

    # the other operations flow: each confirmed, each applied once at the provider
    others = [prepare(sys_ledger, f"k{i}", target=f"case-{i}") for i in range(5)]
    for op_id in others:
        dispatch.delay(op_id)
    assert settled(sys_ledger, others) == dict.fromkeys(others, Status.CONFIRMED)
    for op_id in others:
        assert sandbox.effects(f"crm:{key_of(sys_ledger, op_id)}") == 1

    # the mistyped one is held: not sent, not confirmed, not in review, checked again later
    def held() -> bool:
        history = sys_ledger.history(typo)
        return history.operation.status is Status.UNKNOWN and len(history.attempts) == 1

    wait_until(held, 30, "the worker to hold the mistyped operation")
    dispatch.delay(typo)  # a redelivery changes nothing
    history = sys_ledger.history(typo)
    assert history.operation.status is Status.UNKNOWN
    assert not history.reviews and history.open_review is None
    (attempt,) = history.attempts
    assert attempt.response is not None and attempt.response["code"] == "not_sent"
    next_check = history.operation.next_check_at
    assert next_check is not None and next_check > history.operation.updated_at
    key = history.operation.idempotency_key
    assert attempt.idempotency_key == key and key.startswith("opk_")
    assert sandbox.truth()["requests"].get(f"crm:{key}", []) == []
    assert sandbox.effects(f"crm:{key}") == 0
    assert worker.proc.poll() is None  # still running
    log = wait_until(
        lambda: f"{typo} held, not sent" in worker.output() and worker.output(), 10, "the warning"
    )
    assert log.count(f"{typo} held, not sent: no adapter of this worker serves {TYPO}") == 1

    # visible: opledger check warns (exit 0), the gauge counts it by action; it fails
    # without a beat's tick, which the emptied ledger lost at this test's start: the
    # stack's beat writes it again within seconds
    wait_until(lambda: not sys_ledger.beat_seen().missing(), 15, "the beat's tick")
    check = subprocess.run(
        [sys.executable, "-m", "opledger.cli", "check"],
        env=running.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    warned = f"warn actions: open operations name actions no adapter serves: {TYPO} (1 operation)"
    assert warned in check.stdout, check.stdout
    served = load_registry(settings_of(running.env)).actions
    assert unserved_gauge(sys_ledger, served) == {TYPO: 1}
