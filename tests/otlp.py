"""A small OTLP/HTTP trace receiver on loopback for the tests: it takes what the real
exporter sends to `/v1/traces` (protobuf `ExportTraceServiceRequest`, gzip or not) and
keeps every span, decoded, with its resource's service name."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanPb
from opentelemetry.proto.trace.v1.trace_pb2 import Status as StatusPb

KIND = {v: k.removeprefix("SPAN_KIND_") for k, v in SpanPb.SpanKind.items()}
STATUS = {v: k.removeprefix("STATUS_CODE_") for k, v in StatusPb.StatusCode.items()}


@dataclass(frozen=True)
class Span:
    name: str
    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    kind: str  #: INTERNAL, CLIENT, PRODUCER, CONSUMER ...
    status: str  #: UNSET, OK, ERROR
    attributes: dict[str, Any]
    #: (trace id, span id) of each link
    links: tuple[tuple[str, str], ...] = field(default=())


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for rs in request.resource_spans:
        service = str(_attrs(rs.resource.attributes).get("service.name", ""))
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append(
                    Span(
                        name=s.name,
                        service=service,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None,
                        kind=KIND[s.kind],
                        status=STATUS[s.status.code],
                        attributes=_attrs(s.attributes),
                        links=tuple((x.trace_id.hex(), x.span_id.hex()) for x in s.links),
                    )
                )
    return spans


class Receiver:
    """The spans received so far (thread-safe); `endpoint` for OTEL_EXPORTER_OTLP_ENDPOINT."""

    def __init__(self, port: int) -> None:
        self.endpoint = f"http://127.0.0.1:{port}"
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def add(self, spans: list[Span]) -> None:
        with self._lock:
            self._spans.extend(spans)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def named(self, name: str, **attributes: Any) -> list[Span]:
        """Spans called `name` whose attributes include `attributes`."""
        return [
            s
            for s in self.spans()
            if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
        ]


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    receiver = Receiver(server.server_port)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            receiver.add(decode(body))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server.RequestHandlerClass = Handler
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
