"""The service's span of a check-back: ``check {producer group}``, kind SERVER, the child of the
broker's CLIENT span named by the request's ``traceparent`` header (INTERNAL under the
framework's SERVER span where the framework traces requests itself).

Through the OpenTelemetry API only: until the application (or txbroker's ``setup_tracing``) sets
a TracerProvider the tracer is a no-op and the helpers below return at their first test. This
package imports nothing of txbroker, so the attribute names are written here again; they are
the semantic conventions' (HTTP server, messaging) and the ``txbroker.*`` ones of
docs/tracing.md.
"""

from __future__ import annotations

from typing import Final

from opentelemetry import trace
from opentelemetry.propagate import extract
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from starlette.requests import Request

from txbroker_checkback.contract import CheckRequest, CheckStatus

__all__ = ["answered", "described", "start"]

SPAN_NAME: Final = "check"  # until the body names the producer group: "check {group}"


def start(tracer: Tracer, request: Request) -> Span:
    """The span of one check-back request, not yet ended: SERVER, the child of the broker's
    CLIENT span; or, in an app whose framework already traces requests (FastAPI's telemetry, an
    ASGI middleware: a span is current), INTERNAL under that framework's SERVER span, since a
    request has one SERVER span."""
    framework = trace.get_current_span()
    if framework.get_span_context().is_valid:
        kind, context = SpanKind.INTERNAL, None  # the framework's span is the parent
    else:
        kind, context = SpanKind.SERVER, extract(request.headers)  # the broker's, if it sent one
    return tracer.start_span(
        SPAN_NAME,
        context=context,
        kind=kind,
        attributes={
            "http.request.method": request.method,
            "url.path": request.url.path,
            "url.scheme": request.url.scheme,
            "messaging.system": "txbroker",
            "messaging.operation.name": "check",
            "txbroker.tx.phase": "check",
        },
    )


def described(span: Span, check: CheckRequest) -> None:
    """What the check is about, once its body is read."""
    if not span.is_recording():
        return
    span.update_name(f"{SPAN_NAME} {check.producer_group}")
    span.set_attribute("messaging.destination.name", check.topic)
    if check.message_id is not None:
        span.set_attribute("messaging.message.id", check.message_id)
    span.set_attribute("txbroker.tx.id", check.tx_id)
    span.set_attribute("txbroker.producer.group", check.producer_group)
    span.set_attribute("txbroker.check.count", check.check_count)


def answered(span: Span, status_code: int, status: CheckStatus | None) -> None:
    """The response: its HTTP status and, when the resolver answered, its answer. Ends it."""
    if span.is_recording():
        span.set_attribute("http.response.status_code", status_code)
        if status is not None:
            span.set_attribute("txbroker.check.status", status.value)
        if status_code >= 500:  # HTTP semconv: a server span fails on 5xx only, not on a 401
            span.set_attribute("error.type", str(status_code))
            span.set_status(Status(StatusCode.ERROR))
    span.end()
