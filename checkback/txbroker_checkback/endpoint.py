"""The service side: a Starlette endpoint that answers the broker's check-backs.

    from txbroker_checkback import CheckbackEndpoint

    endpoint = CheckbackEndpoint(resolver, secrets)
    app = Starlette(routes=[Route("/txb/check", endpoint, methods=["POST"])])

``resolver(request) -> CheckStatus`` decides (issue 5's barrier-backed resolver, or any
callable, sync or async). ``secrets`` maps producer group to its shared secret. Requests with
a missing, stale or wrong signature get 401; malformed JSON gets 400; the resolver's answer
goes back as ``{"status": ...}``. A resolver that raises answers 500, which the broker reads as
UNKNOWN: a service error can never turn into a COMMIT.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from txbroker_checkback.contract import MAX_BODY_BYTES, CheckRequest, CheckStatus
from txbroker_checkback.signing import HEADER_SIGNATURE, HEADER_TIMESTAMP, MAX_SKEW_MS, verify

__all__ = ["CheckbackEndpoint", "Resolver"]

log = logging.getLogger(__name__)

Resolver = Callable[[CheckRequest], CheckStatus | Awaitable[CheckStatus]]


class CheckbackEndpoint:
    """An ASGI app for one route: mount it at the check URL the producer registers."""

    def __init__(
        self,
        resolver: Resolver,
        secrets: Mapping[str, str],
        *,
        max_skew_ms: int = MAX_SKEW_MS,
    ) -> None:
        self._resolver = resolver
        self._secrets = dict(secrets)
        self._skew = max_skew_ms

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        response = await self.handle(request)
        await response(scope, receive, send)

    async def handle(self, request: Request) -> Response:
        if request.method != "POST":
            return _error(405, "check-backs are POSTed")
        ts = request.headers.get(HEADER_TIMESTAMP)
        sig = request.headers.get(HEADER_SIGNATURE)
        if not ts or not sig:
            return _error(401, f"missing {HEADER_TIMESTAMP} or {HEADER_SIGNATURE}")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            return _error(413, "body too large for a check-back")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():  # bounded as it arrives, not after
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return _error(413, "body too large for a check-back")
            chunks.append(chunk)
        body = b"".join(chunks)
        try:
            check = msgspec.json.decode(body, type=CheckRequest)
        except msgspec.DecodeError as e:
            return _error(400, f"malformed check-back body: {e}")
        secret = self._secrets.get(check.producer_group)
        if secret is None:
            return _error(401, f"no secret for producer group {check.producer_group!r}")
        why = verify(secret, ts, body, sig, time.time_ns() // 1_000_000, self._skew)
        if why is not None:
            return _error(401, why)
        try:
            answer = self._resolver(check)
            if inspect.isawaitable(answer):
                answer = await answer
            status = CheckStatus(answer)
        except Exception:
            log.exception("check-back resolver failed for %s", check.tx_id)
            return _error(500, "resolver failed")  # the broker reads this as UNKNOWN
        return JSONResponse({"status": status.value})


def _error(status: int, message: str) -> Response:
    return JSONResponse({"error": message}, status)
