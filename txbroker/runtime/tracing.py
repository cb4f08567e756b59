"""Traces through OpenTelemetry, shared by the broker and the services.

Only ``opentelemetry-api`` is a dependency: its tracer is a no-op until a TracerProvider is set.
:func:`setup_tracing` sets one (the SDK's, exporting OTLP over HTTP) when the process asks for
it through the standard variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or ``OTEL_TRACES_EXPORTER=otlp``) and the ``otel`` extra
is installed; the SDK itself reads the rest (``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``,
``OTEL_RESOURCE_ATTRIBUTES``...). No project-specific knob.

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
TX_ID = "txbroker.tx_id"
TX_PHASE = "txbroker.tx.phase"  # prepare, commit, rollback, check
PRODUCER_GROUP = "txbroker.producer_group"


class _State:
    on = False  # a real TracerProvider was set by setup_tracing (or by the application)
    provider: trace.TracerProvider | None = None  # use_provider's, instead of the global one


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
    whether tracing is on. Idempotent; an application that set its own provider keeps it."""
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
    _State.on = provider is not None or type(trace.get_tracer_provider()).__name__ not in (
        "ProxyTracerProvider",
        "NoOpTracerProvider",
    )


def tracer(name: str) -> trace.Tracer:
    if _State.provider is not None:
        return _State.provider.get_tracer(name)
    return trace.get_tracer(name)


def traceparent() -> str | None:
    """The current span's W3C ``traceparent``, to carry in a request or a message property."""
    carrier: dict[str, str] = {}
    inject(carrier)
    return carrier.get("traceparent")


def context_from(traceparent_value: str | None) -> Context | None:
    """The remote parent a ``traceparent`` names (None without one)."""
    if not traceparent_value:
        return None
    return extract({"traceparent": traceparent_value})
