"""Recovery that respects the provider, with real workers, a real broker and the sandbox
provider as a real server that enforces its own limits (a 429 with Retry-After beyond
them) and counts every call it admitted and refused.

- a backlog of thousands drains at the declared rate with no call over the provider's
  limits, each operation applied once;
- a concurrency limit is reached and never passed;
- a provider stricter than declared answers 429s: each is waited out, none counts, none
  asks a person;
- a provider refusing connections for longer than five attempts opens its breaker:
  nothing goes to review, and once it is back every operation is confirmed once.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from opledger.dev.chaos.variants import KINDS, provider_limits
from opledger.dev.faultproxy import FaultProxy
from opledger.dev.processes import Stack, free_port, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from opledger.ledger.contract import Limits
from opledger.tasks.app import dispatch
from tests.forks import ForkedProc
from tests.intents import key_of, prepare

from .conftest import settings_of, settled, worker_with

pytestmark = [pytest.mark.system, pytest.mark.long]

LIMITED = next(kind for kind in KINDS if kind.limits is not None)
KEYED = KINDS[0]  # keyed, with a status API: crm.close_case.v1 at account keyed-status


def limits_env(**limits: float | int) -> dict[str, str]:
    return {"OPLEDGER_PROVIDER_LIMITS": json.dumps({LIMITED.provider: limits})}


def backlog(ledger: Ledger, n: int, prefix: str, action: str = LIMITED.action) -> list[str]:
    """`n` prepared operations, each published once."""
    ops = [
        prepare(ledger, f"{prefix}-{i}", action=action, target=f"case-{prefix}-{i}")
        for i in range(n)
    ]
    for op_id in ops:
        dispatch.delay(op_id)
    return ops


@contextmanager
def limited_worker(
    stack: Stack, sandbox: Sandbox, processes: int, **limits: float | int
) -> Iterator[None]:
    """The sandbox's rate-limited account enforcing `limits` (with room for jitter in its
    burst), and a worker of `processes` processes whose contract declares them."""
    env = limits_env(**limits)
    sandbox.configure(LIMITED.account, **provider_limits(Limits.model_validate(limits)))
    with worker_with(stack, concurrency=processes, **env):
        yield


@contextmanager
def metrics_server(stack: Stack) -> Iterator[str]:
    """`opledger metrics` on a port of its own; its URL."""
    port, password = free_port(), "scrape-pressure"
    server = ForkedProc(
        "metrics-pressure",
        ["metrics", "--port", str(port)],
        {**stack.env, "OPLEDGER_FLOWER_PASSWORD": password},
        stack.workdir / "metrics-pressure.log",
    )
    try:
        wait_until(lambda: "opledger metrics on" in server.output(), 30, "opledger metrics")
        yield f"http://opledger:{password}@127.0.0.1:{port}/metrics"
    finally:
        server.stop()


def provider_gauges(url: str, provider: str) -> dict[str, float]:
    """The scraped gauges labelled with `provider`, by name."""
    body = httpx.get(url, timeout=5).text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.labels.get("provider") == provider and s.name.startswith("opledger_provider_")
    }


def applied_once(sandbox: Sandbox, ledger: Ledger, ops: list[str]) -> None:
    """Each operation applied exactly once, counted under the key the provider received."""
    effects = sandbox.truth()["effects"]
    keys = {op_id: key_of(ledger, op_id) for op_id in ops}
    assert {op_id: effects.get(f"crm:{keys[op_id]}", 0) for op_id in ops} == dict.fromkeys(ops, 1)


def test_a_backlog_drains_at_the_declared_rate_with_no_call_over_the_limit(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    n, rate = 600, 40.0  # 15 s of draining at the limit
    running.kill_worker("w1")
    ops = backlog(sys_ledger, n, "drain")  # the broker holds the whole backlog
    sandbox.configure(LIMITED.account, processing_s=0.02)
    with limited_worker(running, sandbox, 4, concurrency=3, rate=rate, burst=2):
        statuses = settled(sys_ledger, ops, timeout=n / rate * 4)
    assert set(statuses.values()) == {Status.CONFIRMED}
    applied_once(sandbox, sys_ledger, ops)
    seen = sandbox.limited(LIMITED.account)
    assert seen["over_limit"] == 0, seen  # zero calls above the limit, counted there
    assert seen["admitted"] == n
    drained = (n - 1) / (seen["last_admitted_at"] - seen["first_admitted_at"])
    print(f"drained {n} at {drained:.1f} calls/s against a limit of {rate}: {seen}")
    # never faster than the limit: the guarantee; and not starved either, though how close
    # to the limit three worker processes get depends on the machine's load (a run on two
    # saturated cores drained at 34/s), which a benchmark measures, not this test
    assert drained <= 1.1 * rate, f"{drained:.1f} calls/s against {rate}"
    assert drained >= 0.5 * rate, f"{drained:.1f} calls/s against {rate}: starved"
    # every call took one claim: nothing waited by taking a claim, a fence or an attempt
    for op_id in ops[:: n // 50]:
        history = sys_ledger.history(op_id)
        assert len(history.attempts) == 1 and history.operation.fence == 1
        assert not history.reviews


def test_the_concurrency_limit_is_reached_and_never_passed(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    n, slots = 150, 2
    running.kill_worker("w1")
    ops = backlog(sys_ledger, n, "slots")
    sandbox.configure(LIMITED.account, processing_s=0.1)
    with limited_worker(running, sandbox, 4, concurrency=slots, rate=500, burst=10):
        statuses = settled(sys_ledger, ops, timeout=60)
    assert set(statuses.values()) == {Status.CONFIRMED}
    applied_once(sandbox, sys_ledger, ops)
    seen = sandbox.limited(LIMITED.account)
    assert seen["over_limit"] == 0, seen
    assert seen["max_in_flight"] == slots  # four processes, never more than two calls


def test_a_provider_stricter_than_declared_is_waited_out_and_nobody_is_asked(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    n = 60
    running.kill_worker("w1")
    ops = backlog(sys_ledger, n, "strict")
    env = limits_env(rate=50, burst=5)  # the contract says 50 a second...
    sandbox.configure(LIMITED.account, max_concurrent=0, rate_per_s=10, burst=2)  # ...it takes 10
    with worker_with(running, concurrency=2, **env):
        statuses = settled(sys_ledger, ops, timeout=90)
    assert set(statuses.values()) == {Status.CONFIRMED}
    applied_once(sandbox, sys_ledger, ops)
    refused = sandbox.limited(LIMITED.account)["over_limit"]
    assert refused > 0  # it did answer "not now"
    throttled = 0
    for op_id in ops:
        history = sys_ledger.history(op_id)
        assert not history.reviews
        throttled += sum(1 for e in history.evidence if e.detail.get("code") == "throttled")
    assert throttled == refused  # each 429 recorded once, as a "not now", on its operation


def test_a_provider_refusing_connections_pauses_dispatch_and_nothing_goes_to_review(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox
) -> None:
    port = free_port()  # nothing listens here yet: every connection is refused
    provider = KEYED.provider
    env = {
        "OPLEDGER_CRM_URL": f"http://127.0.0.1:{port}",
        "OPLEDGER_PROVIDER_LIMITS": json.dumps(
            {provider: {"probe_every_seconds": 0.5, "probe_max_seconds": 2}}
        ),
    }
    sandbox.configure(KEYED.account, **KEYED.sandbox_config(settings_of(running.env)))
    with worker_with(running, concurrency=2, **env), metrics_server(running) as metrics:
        ops = backlog(sys_ledger, 20, "down", action=KEYED.action)

        def breaker_open() -> bool:
            return any(
                p.provider == provider and p.breaker == "open" for p in sys_ledger.providers()
            )

        wait_until(breaker_open, 30, "the provider's breaker to open")
        opened_at = time.time()
        # refused far longer than five attempts' worth of checks (2 s apart here)
        time.sleep(15)
        assert breaker_open()
        # the metrics say which provider is paused, and since when
        gauges = provider_gauges(metrics, provider)
        assert gauges["opledger_provider_breaker_open"] == 1, gauges
        assert gauges["opledger_provider_paused"] == 1, gauges
        since = gauges["opledger_provider_paused_since_seconds"]
        assert opened_at - 30 < since <= opened_at + 1, (since, opened_at)
        for op_id in ops:
            history = sys_ledger.history(op_id)
            assert not history.reviews, history.reviews
            assert history.operation.status in (Status.PREPARED, Status.UNKNOWN)
        assert sandbox.truth()["requests"] == {}  # nothing reached it
        sent = sum(len(sys_ledger.history(op_id).attempts) for op_id in ops)
        assert sent < 2 * len(ops)  # paused: a probe at a time, not every operation again

        upstream = ("127.0.0.1", int(sandbox.http_url.rsplit(":", 1)[1]))
        with FaultProxy(upstream, port=port):  # the provider is back
            statuses = settled(sys_ledger, ops, timeout=60)
            assert set(statuses.values()) == {Status.CONFIRMED}
            assert not breaker_open()
            gauges = provider_gauges(metrics, provider)
            assert gauges["opledger_provider_breaker_open"] == 0, gauges
    applied_once(sandbox, sys_ledger, ops)
    assert all(not sys_ledger.history(op_id).reviews for op_id in ops)
