"""Traces through OpenTelemetry, shared by the broker and the services.

Only ``opentelemetry-api`` is a dependency: its tracer is a no-op until a TracerProvider is set.
:func:`setup_tracing` sets one (the SDK's, exporting OTLP over HTTP) when the standard
``OTEL_*`` variables ask for it and the ``otel`` extra is installed; no project-specific knob.
Hot paths ask :func:`tracing_on` (one attribute read) before building span attributes, so with
nothing configured a message costs a function call and a boolean test.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagate import extract, inject

log = logging.getLogger(__name__)

MESSAGING_SYSTEM = "txbroker"

# Attribute names: OpenTelemetry messaging semantic conventions, then the project's own.
SYSTEM = "messaging.system"
DESTINATION = "messaging.destination.name"
OPERATION_TYPE = "messaging.operation.type"  # send, receive, process, settle
OPERATION_NAME = "messaging.operation.name"
MESSAGE_ID = "messaging.message.id"
CONSUMER_GROUP = "messaging.consumer.group.name"
PARTITION = "messaging.destination.partition.id"  # the queue id
ERROR_TYPE = "error.type"  # on failure: the error's code (TxbError.code) or class name
TX_ID = "txbroker.tx.id"
TX_PHASE = "txbroker.tx.phase"  # prepare, commit, rollback, check
TX_RESOLVED_BY = "txbroker.tx.resolved_by"  # producer, check, operator
TX_DUPLICATE = "txbroker.tx.duplicate"  # an END_TX repeating the decision already taken
PRODUCER_GROUP = "txbroker.producer.group"
SEND_DUPLICATE = "txbroker.send.duplicate"  # the broker had the idempotency key: not stored again
OUTBOX_ID = "txbroker.outbox.id"  # the outbox row's id
OUTBOX_NAMESPACE = "txbroker.outbox.namespace"  # the relay's name for its database
CHECK_COUNT = "txbroker.check.count"  # checks of this transaction that reached the service before
CHECK_STATUS = "txbroker.check.status"  # COMMIT, ROLLBACK, UNKNOWN
CHECK_OUTCOME = "txbroker.check.outcome"  # answered, bad_answer, timeout, unreachable
# HTTP semantic conventions, for the back-check's CLIENT span.
HTTP_METHOD = "http.request.method"
HTTP_STATUS = "http.response.status_code"
URL_FULL = "url.full"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"


class _State:
    on = False  # a real TracerProvider was set by setup_tracing (or by the application)
    provider: trace.TracerProvider | None = None  # use_provider's, instead of the global one
    # get_tracer builds a new Tracer per call (about 5 us, a third of a span's cost): once each.
    tracers: dict[str, trace.Tracer] = {}


def tracing_on() -> bool:
    """True when spans are recorded somewhere: worth building attributes and headers."""
    return _State.on


def _wanted(env: Mapping[str, str]) -> bool:
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup_tracing(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Install the SDK's TracerProvider with an OTLP/HTTP exporter when the environment asks
    for traces; ``service_name`` applies only when ``OTEL_SERVICE_NAME`` is not set. Returns
    whether tracing is on. Idempotent; an application that set its own provider keeps it.

    The environment asks for traces with ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``OTEL_TRACES_EXPORTER=otlp``; the SDK itself
    reads the rest (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``,
    ``OTEL_RESOURCE_ATTRIBUTES``...)."""
    env = os.environ if env is None else env
    if _State.on:
        return True
    current = trace.get_tracer_provider()
    if type(current).__name__ not in ("ProxyTracerProvider", "NoOpTracerProvider"):
        _State.on = True  # the application configured OpenTelemetry itself
        return True
    if not _wanted(env):
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("OTEL_* asks for traces but the otel extra is not installed: no traces")
        return False
    attrs = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _State.tracers.clear()  # proxies made before would delegate; the SDK's own are direct
    _State.on = True
    log.info("traces exported over OTLP/HTTP")
    return True


def flush_tracing() -> None:
    """Export the spans still queued (a service stopping; the SDK also flushes at exit)."""
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if _State.on and flush is not None:
        flush()


def use_provider(provider: trace.TracerProvider | None) -> None:
    """Record spans with ``provider`` without making it the process's global one (tests, an
    application with several providers); None goes back to the global provider."""
    _State.provider = provider
    _State.tracers.clear()
    _State.on = provider is not None or type(trace.get_tracer_provider()).__name__ not in (
        "ProxyTracerProvider",
        "NoOpTracerProvider",
    )


def tracer(name: str) -> trace.Tracer:
    """The tracer ``name`` of use_provider's provider, else of the global one (made once)."""
    found = _State.tracers.get(name)
    if found is None:
        provider = _State.provider
        found = provider.get_tracer(name) if provider is not None else trace.get_tracer(name)
        _State.tracers[name] = found
    return found


def traceparent(span: trace.Span | None = None) -> str | None:
    """The W3C ``traceparent`` of ``span`` (default: the current span), to carry in a request
    or a message property."""
    carrier: dict[str, str] = {}
    inject(carrier, context=None if span is None else trace.set_span_in_context(span))
    return carrier.get("traceparent")


def context_in(span: trace.Span) -> Context:
    """A context whose current span is ``span``: the parent of a span started in it."""
    return trace.set_span_in_context(span)


def context_from(traceparent_value: str | None) -> Context | None:
    """The remote parent a ``traceparent`` names (None without one)."""
    if not traceparent_value:
        return None
    return extract({"traceparent": traceparent_value})
