"""OpenTelemetry traces: opledger's own spans, Celery's instrumentation, and a tracer
provider in each worker process. Off unless configured.

On in a process when the `[tracing]` extra is installed and the standard environment asks
for an exporter: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is
set, or `OTEL_TRACES_EXPORTER` names one (`otlp`, `console`). `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none` keeps it off. The SDK reads the rest itself (headers, timeout,
`OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`).

`install()` (called where opledger's Celery tasks are defined) sets tracing up after fork
in every worker process (`worker_process_init`) and in beat (`beat_init`); an agent's
process calls `configure()` itself. Off, every span function returns one shared no-op
object and nothing here imports opentelemetry: a global read and a call per span.

Spans (attributes in the `opledger.` namespace; never a payload, a target, a workflow or
intent key, or a secret — they can carry customer data):

- `opledger.prepare`: recording the intent and publishing its dispatch (the Celery
  publish span is its child). Its context is stored on the operation (`traceparent`).
- `opledger.claim`: taking the fenced claim. It (and `opledger.decide`) links to the
  prepare span when the task runs in another trace (a dispatch the relay published, a
  reconcile the sweep handed out).
- `opledger.provider.call` (CLIENT): the adapter's dispatch; `opledger.outcome` says what
  came back (`confirmed`, `rejected`, `ambiguous`).
- `opledger.outcome`: recording an outcome (or settling on evidence); `opledger.status`
  is what the operation became.
- `opledger.decide`: reconcile's decision (`opledger.decision`), its lookups
  (`opledger.provider.lookup`, CLIENT, `opledger.lookup.verdict`) as children.

An unknown outcome is not an error: its span keeps status UNSET and says
`opledger.outcome=ambiguous`, `opledger.status=unknown`. Only an exception (an adapter
bug, a database outage) marks a span ERROR. A fenced-out write says `opledger.fenced=true`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the extra may be missing: types only
    from opentelemetry.trace import Span as OtelSpan
    from opentelemetry.trace import Tracer

log = logging.getLogger("opledger.tracing")

#: the instrumentation scope of opledger's spans
SCOPE = "opledger"

# Attribute names (no semantic convention covers these; `peer.service` and `error.type` do)
OP_ID = "opledger.operation.id"
TENANT = "opledger.tenant"
ACTION = "opledger.action"
PROVIDER = "opledger.provider"
FENCE = "opledger.fence"
ATTEMPT = "opledger.attempt"
STATUS = "opledger.status"
OUTCOME = "opledger.outcome"
OUTCOME_CODE = "opledger.outcome.code"
OUTCOME_SOURCE = "opledger.outcome.source"
DECISION = "opledger.decision"
LOOKUPS = "opledger.lookups"
VERDICT = "opledger.lookup.verdict"
FENCED = "opledger.fenced"
CLAIMED = "opledger.claimed"
REPLAYED = "opledger.replayed"

_TRUE = ("1", "true", "yes", "on")
#: OTLP/HTTP's default endpoint (the collector on this host)
DEFAULT_OTLP_ENDPOINT = "http://localhost:4318"


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (the extra is not checked here)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    exporters = _exporters(env)
    if exporters is not None:
        return bool(exporters)
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _exporters(env: Mapping[str, str]) -> list[str] | None:
    """`OTEL_TRACES_EXPORTER` as a list (empty: none), or None when unset."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not raw:
        return None
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return [] if "none" in names else names


def available() -> bool:
    """Whether the `[tracing]` extra is installed (imports nothing)."""
    import importlib.util

    try:
        return importlib.util.find_spec("opentelemetry.sdk") is not None and (
            importlib.util.find_spec("opentelemetry.instrumentation.celery") is not None
        )
    except ModuleNotFoundError:
        return False


#: opledger's tracer once tracing is on in this process; None: every span is a no-op
_tracer: Tracer | None = None
_provider: Any = None  # the SDK provider this module set up (flushed at shutdown)


def enabled() -> bool:
    """Whether this process records opledger's spans."""
    return _tracer is not None


def install(environ: Mapping[str, str] | None = None) -> None:
    """Set traces up in each Celery worker process after fork (`worker_process_init`: the
    prefork and solo pools) and in beat, flushing at the process's shutdown. Does nothing
    (connects nothing) unless the environment asks for traces."""
    env = os.environ if environ is None else environ
    if not wanted(env):
        return
    if not available():
        log.warning(
            "OTEL_* asks for traces but the tracing extra is not installed: "
            "pip install 'opledger[tracing]' (traces stay off)"
        )
        return
    from celery.signals import beat_init, worker_process_init, worker_process_shutdown

    def _worker(**_: Any) -> None:
        configure(service_name="opledger-worker")

    def _beat(**_: Any) -> None:
        configure(service_name="opledger-beat")

    worker_process_init.connect(_worker, weak=False)
    beat_init.connect(_beat, weak=False)
    worker_process_shutdown.connect(lambda **_: shutdown(), weak=False)


def configure(
    *, service_name: str = "opledger", tracer_provider: Any = None, instrument_celery: bool = True
) -> bool:
    """Turn opledger's spans on in this process; True when they are.

    With `tracer_provider`, opledger's spans (and Celery's) go there and nothing global
    changes. Otherwise, when the environment asks for traces (see `wanted`): a process
    that already has an SDK tracer provider (your application set one up) keeps it, and
    one that has none gets one, exporting as `OTEL_TRACES_EXPORTER` says (`otlp`, over
    HTTP/protobuf unless `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` and its exporter is
    installed; `console`), named `OTEL_SERVICE_NAME` or else `service_name`. Celery is
    instrumented (publish and run spans, context in the message headers) unless it
    already is or `instrument_celery=False`. Safe to call again."""
    global _tracer, _provider
    if tracer_provider is None and not wanted():
        return False
    if not available():
        log.warning("traces need the tracing extra: pip install 'opledger[tracing]'")
        return False
    from opentelemetry import trace

    provider = tracer_provider
    if provider is None:
        provider = trace.get_tracer_provider()
        if not _is_sdk(provider):
            built = _build_provider(service_name)
            if built is None:
                return False
            trace.set_tracer_provider(built)
            provider = trace.get_tracer_provider()
            _provider = built
    if instrument_celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(tracer_provider=provider)
    _tracer = provider.get_tracer(SCOPE, _version())
    return True


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opledger")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


def _is_sdk(provider: Any) -> bool:
    from opentelemetry.sdk.trace import TracerProvider

    return isinstance(provider, TracerProvider)


def _build_provider(service_name: str) -> Any:
    """An SDK provider exporting as the environment says; None when it names no exporter
    this install has (logged)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    exporters = []
    for name in _exporters(os.environ) or ["otlp"]:
        if name == "otlp":
            exporter = _otlp_exporter()
            if exporter is None:
                return None
            exporters.append(exporter)
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        else:
            log.error("OTEL_TRACES_EXPORTER=%s: opledger exports to otlp or console only", name)
            return None
    # A name given in the environment wins (Resource.create would prefer ours over it)
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name" in _resource_env()
    resource = Resource.create({} if named else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)  # reads OTEL_TRACES_SAMPLER itself
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _resource_env() -> set[str]:
    raw = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    return {item.split("=", 1)[0].strip() for item in raw.split(",") if "=" in item}


def _otlp_exporter() -> Any:
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.error(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc, but its exporter is not installed: "
                "pip install opentelemetry-exporter-otlp-proto-grpc, or use http/protobuf "
                "(traces stay off)"
            )
            return None
        return GrpcExporter()
    if protocol != "http/protobuf":
        log.error("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported (traces stay off)", protocol)
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The endpoint as the SDK would read it, except that an empty variable (a compose file's
    # `${OTEL_EXPORTER_OTLP_ENDPOINT:-}`) counts as unset; headers, timeout and compression
    # come from OTEL_* as usual.
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
        (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or DEFAULT_OTLP_ENDPOINT).rstrip("/")
        + "/v1/traces"
    )
    return OTLPSpanExporter(endpoint=endpoint)


def shutdown() -> None:
    """Export what is buffered and stop (a worker process exiting). Idempotent."""
    global _tracer, _provider
    provider, _provider = _provider, None
    _tracer = None
    if provider is not None:
        try:
            provider.shutdown()
        except Exception as exc:  # a collector that went away must not fail the exit
            log.warning("flushing traces at shutdown failed: %s", exc)


# -- spans --------------------------------------------------------------------------------


class _NoopSpan:
    """What every span function returns while traces are off: does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoopSpan:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def traceparent(self) -> str | None:
        return None

    def operation(self, op: Any) -> None:
        pass

    def prepared(self, op: Any) -> None:
        pass

    def claim(self, claim: Any) -> None:
        pass

    def sending(self) -> None:
        pass

    def answered(self) -> None:
        pass

    def outcome(self, outcome: Any) -> None:
        pass

    def status(self, status: Any) -> None:
        pass

    def decision(self, decision: Any, lookups: int) -> None:
        pass

    def verdict(self, verdict: Any) -> None:
        pass

    def fenced(self) -> None:
        pass

    def error(self, exc: BaseException) -> None:
        pass

    def set(self, key: str, value: Any) -> None:
        pass


NOOP = _NoopSpan()


class _Span:
    """One of opledger's spans, current while its `with` block runs.

    An exception leaving the block marks it ERROR (with `error.type`); what the block
    handled itself (an ambiguous outcome, a fenced write) does not."""

    __slots__ = ("_activation", "_expected", "_span")

    def __init__(self, span: OtelSpan) -> None:
        from opentelemetry.trace import use_span

        self._span = span
        self._expected = False
        self._activation = use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        )

    def __enter__(self) -> _Span:
        self._activation.__enter__()
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is not None and not self._expected:
            self.error(exc)
        self._activation.__exit__(kind, exc, tb)

    def traceparent(self) -> str | None:
        """This span's context as a W3C `traceparent`."""
        return self.format(self._span.get_span_context())

    @staticmethod
    def format(ctx: Any) -> str | None:
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(key, value)

    def operation(self, op: Any) -> None:
        """The operation's id, tenant, action, provider and fence; and a link to the span
        that prepared it when that is in another trace."""
        span = self._span
        span.set_attribute(OP_ID, op.id)
        span.set_attribute(TENANT, op.tenant)
        span.set_attribute(ACTION, op.action)
        span.set_attribute(PROVIDER, op.provider)
        span.set_attribute(FENCE, op.fence)
        span.set_attribute(STATUS, str(op.status))
        origin = _parse_traceparent(op.traceparent)
        if origin is not None and origin.trace_id != span.get_span_context().trace_id:
            span.add_link(origin, {"opledger.link": "prepared"})

    def prepared(self, op: Any) -> None:
        """The operation `prepare` returned; `opledger.replayed` when it was recorded
        before (by another call, in another trace or untraced)."""
        self.operation(op)
        self._span.set_attribute(REPLAYED, op.traceparent != self.traceparent())

    def sending(self) -> None:
        """The request leaves next (the send-by window held): nothing to record."""

    def answered(self) -> None:
        """The adapter returned: its outcome follows (`outcome`)."""

    def claim(self, claim: Any) -> None:
        self.operation(claim.operation)
        self._span.set_attribute(CLAIMED, True)
        self._span.set_attribute(FENCE, claim.fence)
        self._span.set_attribute(ATTEMPT, claim.attempt_n)

    def outcome(self, outcome: Any) -> None:
        """What came back: its kind and code. Ambiguous is not an error."""
        self._span.set_attribute(OUTCOME, outcome.kind)
        code = getattr(outcome, "code", None)
        if code:
            self._span.set_attribute(OUTCOME_CODE, str(code))

    def status(self, status: Any) -> None:
        self._span.set_attribute(STATUS, str(status))

    def decision(self, decision: Any, lookups: int) -> None:
        self._span.set_attribute(DECISION, type(decision).__name__)
        self._span.set_attribute(LOOKUPS, lookups)

    def verdict(self, verdict: Any) -> None:
        self._span.set_attribute(VERDICT, str(verdict))

    def fenced(self) -> None:
        """Another claim moved the operation first: this write was refused. Expected, not
        an error: the exception that says so (`StaleFence`) leaves the span UNSET."""
        self._span.set_attribute(FENCED, True)
        self._expected = True

    def error(self, exc: BaseException) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.record_exception(exc)
        self._span.set_attribute("error.type", type(exc).__qualname__)
        self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def _parse_traceparent(value: str | None) -> Any:
    """A span context from a W3C traceparent (None if absent or malformed)."""
    if not value:
        return None
    parts = value.split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    from opentelemetry.trace import SpanContext, TraceFlags

    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return ctx if ctx.is_valid else None


def _start(name: str, kind: str = "INTERNAL", attributes: dict[str, Any] | None = None) -> _Span:
    from opentelemetry.trace import SpanKind

    assert _tracer is not None
    return _Span(_tracer.start_span(name, kind=SpanKind[kind], attributes=attributes))


def traceparent() -> str | None:
    """The current span's context as a W3C `traceparent` (None when traces are off or no
    span is current): what to pass to `Ledger.prepare` outside an `opledger.prepare` span."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    return _Span.format(get_current_span().get_span_context())


def prepare(tenant: str, action: str) -> _Span | _NoopSpan:
    """`opledger.prepare`: recording an intent and publishing its dispatch. Pass its
    `traceparent()` to `Ledger.prepare` and call `prepared(op)` with what came back."""
    if _tracer is None:
        return NOOP
    return _start("opledger.prepare", attributes={TENANT: tenant, ACTION: action})


def claim(op_id: str) -> _Span | _NoopSpan:
    """`opledger.claim`: taking the fenced claim on `op_id` (call `claim(c)` on success)."""
    if _tracer is None:
        return NOOP
    return _start("opledger.claim", attributes={OP_ID: op_id, CLAIMED: False})


def provider_call(claim: Any) -> _Span | _NoopSpan:
    """`opledger.provider.call`: the adapter's dispatch under `claim`."""
    if _tracer is None:
        return NOOP
    op = claim.operation
    return _start(
        "opledger.provider.call",
        "CLIENT",
        {
            OP_ID: claim.op_id,
            TENANT: op.tenant,
            ACTION: op.action,
            PROVIDER: op.provider,
            "peer.service": op.provider,
            FENCE: claim.fence,
            ATTEMPT: claim.attempt_n,
        },
    )


def lookup(op: Any) -> _Span | _NoopSpan:
    """`opledger.provider.lookup`: reconcile reading the provider's evidence on `op`."""
    if _tracer is None:
        return NOOP
    return _start(
        "opledger.provider.lookup",
        "CLIENT",
        {
            OP_ID: op.id,
            TENANT: op.tenant,
            ACTION: op.action,
            PROVIDER: op.provider,
            "peer.service": op.provider,
            FENCE: op.fence,
        },
    )


def outcome(op_id: str, fence: int, source: str) -> _Span | _NoopSpan:
    """`opledger.outcome`: recording what happened to `op_id` (`source`: `provider`, a
    dispatch's answer, or `evidence`, reconcile settling on it)."""
    if _tracer is None:
        return NOOP
    return _start(
        "opledger.outcome", attributes={OP_ID: op_id, FENCE: fence, OUTCOME_SOURCE: source}
    )


def decide(op_id: str) -> _Span | _NoopSpan:
    """`opledger.decide`: reconcile's decision on `op_id`, lookups included."""
    if _tracer is None:
        return NOOP
    return _start("opledger.decide", attributes={OP_ID: op_id})
