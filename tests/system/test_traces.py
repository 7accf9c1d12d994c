"""OpenTelemetry traces through real processes: an agent process (`tracing.configure()`)
and `opledger worker`s export with the real OTLP/HTTP exporter to a receiver on loopback.

One operation's trace is whole: the agent's `opledger.prepare` -> Celery's publish -> the
worker's run -> `opledger.claim`, `opledger.provider.call`, `opledger.outcome`. Another is
dispatched by a worker SIGKILLed after the provider answered: the reconcile that settles
it (in the sweep's trace) looks the evidence up (`opledger.provider.lookup`) and links
back to the agent's prepare span, whose context the ledger kept."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from opledger.dev.chaos.variants import KINDS, configure_sandbox
from opledger.dev.processes import Stack, wait_until
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Ledger, Status
from tests.otlp import Receiver, Span, otlp_receiver

from .conftest import crashes, settings_of, settled, worker_with

pytestmark = pytest.mark.system

KEYED = KINDS[0]  # keyed, with a status API: a lookup proves what the killed worker sent
SECRET = "do-not-trace-this-note"
TARGET = "case-traced-"  # and a number: each operation closes its own case

# An agent's process: its own tracer provider (OTEL_* from the environment), one effect
# recorded and published; the spans are flushed before it exits.
AGENT = f"""
import sys
from opledger.adapters.registry import load_registry
from opledger.agents.effects import Effects
from opledger.ledger import Ledger
from opledger.observability import tracing
from opledger.settings import get_settings

assert tracing.configure(service_name="agent")
settings = get_settings()
ledger = Ledger.from_url(settings.require_database_url(), actions=load_registry(settings))
result = Effects(ledger).effect(
    tenant="acme", run="traces", intent_key=sys.argv[1], action=sys.argv[2], target=sys.argv[3],
    payload={{"note": "{SECRET}"}}, authorization_ref="auth_acme",
)
print(result.op_id)
tracing.shutdown()
"""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as r:
        yield r


def agent(env: dict[str, str], step: str, action: str, target: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", AGENT, step, action, target],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def one(spans: list[Span], what: str) -> Span:
    assert len(spans) == 1, f"{what}: {spans}"
    return spans[0]


def test_one_operations_trace_is_whole_and_a_crash_is_reconciled_with_a_lookup(
    running: Stack, sys_ledger: Ledger, sandbox: Sandbox, receiver: Receiver
) -> None:
    configure_sandbox(sandbox, settings_of(running.env))
    # Any, not str: unpacked into start_worker(), whose concurrency is an int
    otel: dict[str, Any] = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export before the next kill, not every 5 s
    }
    agent_env = {**running.env, **otel}
    # after the block, the plain w1 again: no crash point, exporting nothing
    with worker_with(
        running, "crashy", concurrency=1, OPLEDGER_CRASHPOINT="dispatch.after_call", **otel
    ) as crashy:
        crashed = agent(agent_env, "crash", KEYED.action, f"{TARGET}1")
        wait_until(lambda: crashes(crashy) >= 1, 30, "the crash after the call")
        running.kill_worker("crashy")
        running.start_worker("w1", **otel)
        whole = agent(agent_env, "whole", KEYED.action, f"{TARGET}2")
        final = settled(sys_ledger, [crashed, whole])
        assert final == {crashed: Status.CONFIRMED, whole: Status.CONFIRMED}
        wait_until(
            lambda: (
                receiver.named("opledger.outcome", **{"opledger.operation.id": whole})
                and receiver.named(
                    "opledger.outcome",
                    **{"opledger.operation.id": crashed, "opledger.outcome.source": "evidence"},
                )
            ),
            15,
            "both outcomes' spans",
        )

    # -- the whole trace of one operation: prepare -> publish -> run -> claim, call, outcome
    op = {"opledger.operation.id": whole}
    prepare = one(receiver.named("opledger.prepare", **op), "the agent's prepare span")
    trace = [s for s in receiver.spans() if s.trace_id == prepare.trace_id]
    by_id = {s.span_id: s for s in trace}
    publish = one(
        [s for s in trace if s.name == "apply_async/opledger.dispatch"], "Celery's publish"
    )
    run = one([s for s in trace if s.name == "run/opledger.dispatch"], "Celery's run")
    assert prepare.service == "agent" and run.service == "opledger-worker"
    assert (publish.parent_id, publish.kind) == (prepare.span_id, "PRODUCER")
    assert (run.parent_id, run.kind) == (publish.span_id, "CONSUMER")
    steps = {s.name: s for s in trace if s.parent_id == run.span_id}
    assert {"opledger.claim", "opledger.provider.call", "opledger.outcome"} <= set(steps)
    for name in ("opledger.claim", "opledger.provider.call", "opledger.outcome"):
        assert steps[name].attributes["opledger.operation.id"] == whole, steps[name]
        assert steps[name].status == "UNSET", steps[name]
    claim, call, outcome = (
        steps[n] for n in ("opledger.claim", "opledger.provider.call", "opledger.outcome")
    )
    assert claim.attributes["opledger.fence"] == 1 and claim.attributes["opledger.attempt"] == 1
    assert claim.attributes["opledger.tenant"] == "acme"
    assert call.kind == "CLIENT" and call.attributes["opledger.outcome"] == "confirmed"
    assert call.attributes["opledger.action"] == KEYED.action
    assert call.attributes["opledger.provider"] == sys_ledger.get(whole).provider
    assert outcome.attributes["opledger.status"] == "confirmed"
    assert all(by_id.get(s.parent_id or "") or s is prepare for s in trace)  # one tree
    # neither the payload nor the target is in any span
    values = [str(v) for s in receiver.spans() for v in s.attributes.values()]
    assert not [v for v in values if SECRET in v or TARGET in v]

    # -- the crashed one: reconciled from the provider's evidence, linked to its prepare
    op = {"opledger.operation.id": crashed}
    origin = one(receiver.named("opledger.prepare", **op), "the crashed one's prepare")
    lookup = receiver.named("opledger.provider.lookup", **op)
    assert lookup and lookup[-1].kind == "CLIENT", lookup
    assert lookup[-1].attributes["opledger.lookup.verdict"] == "confirmed"
    decide = one(
        [s for s in receiver.named("opledger.decide", **op) if s.span_id == lookup[-1].parent_id],
        "the decision the lookup served",
    )
    assert decide.attributes["opledger.decision"] == "Confirm"
    assert (origin.trace_id, origin.span_id) in decide.links  # back to the agent's trace
    settle = one(
        receiver.named("opledger.outcome", **op, **{"opledger.outcome.source": "evidence"}),
        "settling on the evidence",
    )
    assert (
        settle.trace_id == decide.trace_id and settle.attributes["opledger.status"] == "confirmed"
    )
