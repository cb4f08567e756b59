"""The check-back endpoint's span over real HTTP: the broker side's ``call_check`` with a span's
traceparent, a Starlette app serving ``CheckbackEndpoint``, spans in an in-memory provider.
The traceparent header leaves the signature valid; the endpoint's span is a SERVER span, the
caller's child, or INTERNAL under the framework's SERVER span where the app traces requests."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.opentelemetry import OpenTelemetryMiddleware
from starlette.routing import Route

from tests.httpserver import serve_app
from txbroker.runtime.tracing import traceparent
from txbroker_checkback import (
    CheckbackEndpoint,
    CheckOutcome,
    CheckRequest,
    CheckStatus,
    call_check,
)

SECRETS = {"orders-svc": "s3cret"}
CHECK = CheckRequest("tx-1", "orders", "orders-svc", 2, key="o-1", message_id="m-1")


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _app(tracer: Tracer, *, framework: TracerProvider | None = None) -> Starlette:
    def resolver(check: CheckRequest) -> CheckStatus:
        if check.tx_id == "broken":
            raise RuntimeError("the database is down")
        return CheckStatus.COMMIT

    endpoint = CheckbackEndpoint(resolver, SECRETS, tracer=tracer)
    middleware = (
        []
        if framework is None
        else [Middleware(OpenTelemetryMiddleware, tracer_provider=framework)]
    )
    return Starlette(
        routes=[Route("/txb/check", endpoint, methods=["POST"])], middleware=middleware
    )


async def _check(
    base: str, tracer: Tracer, check: CheckRequest = CHECK, secret: str = "s3cret"
) -> tuple[CheckOutcome, CheckStatus, int, int]:
    """A check sent under a CLIENT span, as the broker sends it: (outcome, status, HTTP status,
    the CLIENT span's id)."""
    with tracer.start_as_current_span("check orders-svc", kind=SpanKind.CLIENT) as client:
        async with httpx.AsyncClient() as http:
            res = await call_check(http, base + "/txb/check", check, secret, traceparent(), 5)
    assert res.http_status is not None
    return res.outcome, res.status, res.http_status, client.get_span_context().span_id


def _only(spans: tuple[ReadableSpan, ...], kind: SpanKind) -> ReadableSpan:
    (span,) = [s for s in spans if s.kind == kind]
    return span


async def test_the_endpoints_server_span_is_the_brokers_child(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    p, exporter = provider
    tracer = p.get_tracer("test")
    async with serve_app(_app(tracer)) as base:
        outcome, status, code, client_id = await _check(base, tracer)
    assert (outcome, status, code) == (CheckOutcome.ANSWERED, CheckStatus.COMMIT, 200)
    server = _only(exporter.get_finished_spans(), SpanKind.SERVER)
    assert server.name == "check orders-svc"
    assert server.parent is not None and server.parent.span_id == client_id
    attrs = dict(server.attributes or {})
    assert attrs["http.request.method"] == "POST"
    assert attrs["url.path"] == "/txb/check"
    assert attrs["http.response.status_code"] == 200
    assert attrs["messaging.system"] == "txbroker"
    assert attrs["messaging.destination.name"] == "orders"
    assert attrs["messaging.message.id"] == "m-1"
    assert attrs["txbroker.tx.id"] == "tx-1"
    assert attrs["txbroker.producer.group"] == "orders-svc"
    assert attrs["txbroker.check.count"] == 2
    assert attrs["txbroker.check.status"] == "COMMIT"
    assert server.status.status_code == StatusCode.UNSET


async def test_refused_and_failed_checks(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    p, exporter = provider
    tracer = p.get_tracer("test")
    async with serve_app(_app(tracer)) as base:
        bad = await _check(base, tracer, secret="wrong")
        broken = await _check(base, tracer, CheckRequest("broken", "orders", "orders-svc", 0))
    assert bad[:3] == (CheckOutcome.BAD_ANSWER, CheckStatus.UNKNOWN, 401)
    assert broken[:3] == (CheckOutcome.BAD_ANSWER, CheckStatus.UNKNOWN, 500)
    refused, failed = sorted(
        (s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER),
        key=lambda s: s.start_time or 0,
    )
    # An unsigned body names nothing: the span keeps its bare name; a 4xx is not a server error.
    assert refused.name == "check"
    assert "txbroker.tx.id" not in (refused.attributes or {})
    assert dict(refused.attributes or {})["http.response.status_code"] == 401
    assert refused.status.status_code == StatusCode.UNSET
    assert failed.name == "check orders-svc"
    assert dict(failed.attributes or {})["error.type"] == "500"
    assert failed.status.status_code == StatusCode.ERROR


async def test_under_a_framework_that_traces_requests_the_span_is_internal(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    p, exporter = provider
    tracer = p.get_tracer("test")
    async with serve_app(_app(tracer, framework=p)) as base:
        outcome, status, _, client_id = await _check(base, tracer)
    assert (outcome, status) == (CheckOutcome.ANSWERED, CheckStatus.COMMIT)
    spans = exporter.get_finished_spans()
    framework = _only(spans, SpanKind.SERVER)  # one SERVER span per request: the framework's
    ours = _only(spans, SpanKind.INTERNAL)
    assert framework.name == "POST /txb/check"
    assert framework.parent is not None and framework.parent.span_id == client_id
    assert ours.name == "check orders-svc"
    assert ours.parent is not None and ours.parent.span_id == framework.context.span_id
    assert dict(ours.attributes or {})["txbroker.check.status"] == "COMMIT"
