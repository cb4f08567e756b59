"""The service side: a Starlette endpoint that answers the broker's check-backs.

    endpoint = CheckbackEndpoint(resolver, secrets)
    app = Starlette(routes=[Route("/txb/check", endpoint, methods=["POST"])])

``resolver(request) -> CheckStatus`` decides (the SDK's barrier-backed resolver, or any
callable, sync or async); ``secrets`` maps producer group to its shared secret. A resolver that
raises answers 500, which the broker reads as UNKNOWN: a service error can never turn into a
COMMIT. :class:`CheckbackEndpoint` gives the other answers and the span.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, Tracer
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from txbroker_checkback import spans
from txbroker_checkback.contract import MAX_BODY_BYTES, CheckRequest, CheckStatus
from txbroker_checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP, MAX_SKEW_MS, verify

__all__ = ["CheckbackEndpoint", "Resolver"]

log = logging.getLogger(__name__)

Resolver = Callable[[CheckRequest], CheckStatus | Awaitable[CheckStatus]]


class CheckbackEndpoint:
    """An ASGI app for one route: mount it at the check URL the producer registers.

    Requests with a missing, stale or wrong signature get 401; malformed JSON gets 400; the
    resolver's answer goes back as ``{"status": ...}``, and a resolver that raises answers 500.
    Each request is a SERVER span ``check {producer group}`` (``txbroker_checkback.spans``), the
    child of the broker's CLIENT span through the ``traceparent`` header; ``tracer`` overrides
    the OpenTelemetry API's global one.
    """

    def __init__(
        self,
        resolver: Resolver,
        secrets: Mapping[str, str],
        *,
        max_skew_ms: int = MAX_SKEW_MS,
        tracer: Tracer | None = None,
    ) -> None:
        self._resolver = resolver
        self._secrets = dict(secrets)
        self._skew = max_skew_ms
        # The API's tracer is a no-op until a TracerProvider is set, then records through it.
        self._tracer = tracer if tracer is not None else trace.get_tracer(__name__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        span = spans.start(self._tracer, request)
        try:
            # Current while the resolver runs: its own spans (a database's) nest under it.
            with trace.use_span(span, end_on_exit=False):
                response, status = await self._respond(request, span)
        except BaseException:
            span.end()  # the request broke off (the broker went away): no response to describe
            raise
        spans.answered(span, response.status_code, status)
        await response(scope, receive, send)

    async def handle(self, request: Request) -> Response:
        """The response to one check-back request (untraced)."""
        return (await self._respond(request, INVALID_SPAN))[0]

    async def _respond(self, request: Request, span: Span) -> tuple[Response, CheckStatus | None]:
        """The response, and the resolver's answer when it gave one."""
        if request.method != "POST":
            return _error(405, "check-backs are POSTed"), None
        ts = request.headers.get(HEADER_TIMESTAMP)
        sig = request.headers.get(HEADER_SIGNATURE)
        if not ts or not sig:
            return _error(401, f"missing {HEADER_TIMESTAMP} or {HEADER_SIGNATURE}"), None
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            return _error(413, "body too large for a check-back"), None
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():  # bounded as it arrives, not after
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return _error(413, "body too large for a check-back"), None
            chunks.append(chunk)
        body = b"".join(chunks)
        try:
            check = msgspec.json.decode(body, type=CheckRequest)
        except msgspec.DecodeError as e:
            return _error(400, f"malformed check-back body: {e}"), None
        secret = self._secrets.get(check.producer_group)
        if secret is None:
            return _error(401, f"no secret for producer group {check.producer_group!r}"), None
        why = verify(secret, ts, body, sig, time.time_ns() // 1_000_000, self._skew)
        if why is not None:
            return _error(401, why), None
        spans.described(span, check)  # only now: an unsigned body names nothing worth tracing
        try:
            answer = self._resolver(check)
            if inspect.isawaitable(answer):
                answer = await answer
            status = CheckStatus(answer)
        except Exception:
            log.exception("check-back resolver failed for %s", check.tx_id)
            return _error(500, "resolver failed"), None  # the broker reads this as UNKNOWN
        return JSONResponse({"status": status.value}), status


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status)
