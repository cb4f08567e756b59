"""setup_tracing: the SDK only when OTEL_* asks for it; the API's no-op tracer otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

_PROBE = """
from opentelemetry import trace
from txbroker.runtime.tracing import setup_tracing, flush_tracing, tracing_on
on = setup_tracing("probe")
with trace.get_tracer("probe").start_as_current_span("x") as span:
    recording = span.is_recording()
flush_tracing()
print(on, tracing_on(), recording, type(trace.get_tracer_provider()).__name__)
"""


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_nothing_configured_keeps_the_no_op_tracer() -> None:
    assert _probe() == "False False False ProxyTracerProvider"


def test_exporter_none_is_respected() -> None:
    assert _probe(OTEL_TRACES_EXPORTER="none", OTEL_EXPORTER_OTLP_ENDPOINT="http://x") == (
        "False False False ProxyTracerProvider"
    )


def test_an_otlp_endpoint_installs_the_sdk() -> None:
    # Port 9 (discard): nothing listens, the exporter's failure is logged, nothing raises.
    out = _probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_BSP_EXPORT_TIMEOUT="500")
    assert out == "True True True TracerProvider"
