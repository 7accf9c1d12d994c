"""opledger's spans on the worker steps, against the real ledger and sandbox CRM, recorded
by an SDK tracer provider of the test's own (`tracing.configure(tracer_provider=...)`:
nothing global changes). An unknown outcome is not an error; an adapter that raises is."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from opledger.adapters.crm import CrmAdapter, crm_contract
from opledger.adapters.registry import Registry
from opledger.dev.sandbox import Sandbox
from opledger.ledger import Claim, InvalidInput, Ledger, Outcome, Status
from opledger.observability import tracing
from opledger.tasks import steps
from tests.intents import Change, prepare, prepare_op

LEASE = timedelta(seconds=5)
#: an agent's prepare span, as the ledger keeps it
ORIGIN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
#: what no span may carry: the payload (and the target, case-<key>)
SECRET = Change(payload={"note": "secret note"})


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing.configure(tracer_provider=provider, instrument_celery=False)
    try:
        yield exporter
    finally:
        tracing.shutdown()
        provider.shutdown()


@pytest.fixture
def crm(crms: Callable[..., CrmAdapter]) -> CrmAdapter:
    return crms(
        request_timeout=timedelta(seconds=0.5),
        max_in_flight=timedelta(seconds=0.6),
        lookup_interval=timedelta(seconds=0.2),
    )


def _ledger(ledger: Ledger, adapter: CrmAdapter) -> tuple[Ledger, Registry]:
    registry = Registry([adapter])
    mine = Ledger(ledger.engine, actions=registry)
    mine.grant(tenant="acme", scope=["crm.*"], granted_by="t", ref="auth_acme")
    return mine, registry


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_an_unknown_outcome_is_marked_as_such_not_as_an_error_and_reconcile_is_traced(
    ledger: Ledger, sandbox: Sandbox, crm: CrmAdapter, spans: InMemorySpanExporter
) -> None:
    ledger, registry = _ledger(ledger, crm)
    sandbox.fault("crm", "drop_after_commit")  # applied, the response lost
    op_id = prepare(ledger, "dropped", traceparent=ORIGIN, **SECRET)
    result = steps.dispatch(ledger, registry, op_id, owner="w1", lease=LEASE)
    assert result.operation is not None and result.operation.status is Status.UNKNOWN

    (claim,) = _named(spans, "opledger.claim")
    (call,) = _named(spans, "opledger.provider.call")
    (outcome,) = _named(spans, "opledger.outcome")
    assert claim.attributes is not None and claim.attributes["opledger.claimed"] is True
    # the claim links back to the prepare span the ledger kept (another trace)
    assert [(f"{x.context.trace_id:032x}", f"{x.context.span_id:016x}") for x in claim.links] == [
        (ORIGIN[3:35], ORIGIN[36:52])
    ]
    assert call.attributes is not None and call.attributes["opledger.outcome"] == "ambiguous"
    assert call.status.status_code is StatusCode.UNSET and "error.type" not in call.attributes
    assert outcome.attributes is not None and outcome.attributes["opledger.status"] == "unknown"
    assert outcome.status.status_code is StatusCode.UNSET

    # reconcile: the status API finds the provider's record of our key (a lookup is a read:
    # it need not wait for the call's in-flight deadline)
    assert steps.reconcile(ledger, registry, op_id, owner="w2", lease=LEASE).action == "confirmed"
    (decision,) = _named(spans, "opledger.decide")
    assert decision.attributes is not None and decision.attributes["opledger.decision"] == "Confirm"
    assert decision.attributes["opledger.lookups"] == 1
    (lookup,) = _named(spans, "opledger.provider.lookup")
    assert lookup.parent is not None and lookup.parent.span_id == decision.context.span_id
    assert lookup.attributes is not None and lookup.attributes["opledger.lookup.verdict"] == (
        "confirmed"
    )
    settled = _named(spans, "opledger.outcome")[-1]
    assert settled.attributes is not None
    assert settled.attributes["opledger.outcome.source"] == "evidence"
    assert settled.attributes["opledger.status"] == "confirmed"
    for span in spans.get_finished_spans():  # no payload, no target
        assert not any(
            "secret" in str(v) or "case-" in str(v) for v in (span.attributes or {}).values()
        )


class Broken(CrmAdapter):
    def dispatch(self, claim: Claim) -> Outcome:
        raise RuntimeError("adapter bug")


def test_an_adapter_that_raises_is_an_error_on_the_call_and_the_outcome_is_unknown(
    ledger: Ledger, sandbox: Sandbox, spans: InMemorySpanExporter
) -> None:
    adapter = Broken(sandbox.http_url, account="acme", contract=crm_contract())
    try:
        ledger, registry = _ledger(ledger, adapter)
        op_id = prepare(ledger, "broken", traceparent=ORIGIN, **SECRET)
        steps.dispatch(ledger, registry, op_id, owner="w1", lease=LEASE)
    finally:
        adapter.close()
    (call,) = _named(spans, "opledger.provider.call")
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes is not None and call.attributes["error.type"] == "RuntimeError"
    assert call.attributes["opledger.outcome.code"] == "adapter_error"
    (outcome,) = _named(spans, "opledger.outcome")
    assert outcome.attributes is not None and outcome.attributes["opledger.status"] == "unknown"
    assert outcome.status.status_code is StatusCode.UNSET


def test_prepare_keeps_the_first_trace_context_and_refuses_a_malformed_one(
    ledger: Ledger, crm: CrmAdapter
) -> None:
    ledger, _ = _ledger(ledger, crm)
    op_id = prepare(ledger, "kept", traceparent=ORIGIN, **SECRET)
    # a replay from another trace
    other = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    again = prepare_op(ledger, "kept", traceparent=other, **SECRET)
    assert again.id == op_id and again.traceparent == ORIGIN
    with pytest.raises(InvalidInput):
        prepare(ledger, "too-long", traceparent="0" * 300, **SECRET)
