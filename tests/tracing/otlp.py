"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` on a loopback port, each body
decoded with opentelemetry-proto's ``ExportTraceServiceRequest`` into plain :class:`Received`
spans. What a collector would get is exactly what the processes under test exported."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

__all__ = ["OtlpReceiver", "Received"]


@dataclass(frozen=True)
class Received:
    service: str  # the resource's service.name
    name: str
    kind: str  # SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    attributes: dict[str, Any]
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id)
    error: bool = False  # status ERROR

    def __repr__(self) -> str:  # short, for assertion messages
        return f"<{self.service}: {self.kind} {self.name!r} {self.span_id}<-{self.parent_id}>"


def _value(v: AnyValue) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _decode(req: ExportTraceServiceRequest) -> list[Received]:
    out: list[Received] = []
    for rs in req.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    Received(
                        service=str(resource.get("service.name", "")),
                        name=s.name,
                        kind=Span.SpanKind.Name(s.kind).removeprefix("SPAN_KIND_"),
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        error=s.status.code == Status.STATUS_CODE_ERROR,
                    )
                )
    return out


class OtlpReceiver:
    """``with OtlpReceiver() as rx:`` point ``OTEL_EXPORTER_OTLP_ENDPOINT`` at ``rx.endpoint``."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.requests = 0  # POSTs of any kind received (spans or not)
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                req = ExportTraceServiceRequest()
                req.ParseFromString(data)
                receiver._add(self.path, req)
                body = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the test reports what it received

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def _add(self, path: str, req: ExportTraceServiceRequest) -> None:
        with self._changed:
            self.requests += 1
            if path == "/v1/traces":
                self.spans.extend(_decode(req))
            self._changed.notify_all()

    def wait_for(self, ready: Callable[[list[Received]], bool], timeout_s: float) -> bool:
        """Block until ``ready(spans)`` holds (checked on each export) or the time is up."""
        with self._changed:
            return self._changed.wait_for(lambda: ready(list(self.spans)), timeout_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
