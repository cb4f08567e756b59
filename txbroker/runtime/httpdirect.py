"""Requests the HTTP server answers itself, past ASGI: a Starlette app's :class:`DirectRoute` s.

A request to a direct route goes from uvicorn's parser to the route's endpoint as a
:class:`DirectRequest` (its method, path, headers and body, nothing built that the endpoint
does not read), and the endpoint's Response goes to the socket in one write. For the hot
requests of the HTTP API (a single publish is a few hundred bytes each way) the ASGI layers,
uvicorn's request cycle and ASGI messages, Starlette's middleware, router, Request and
Response, cost more CPU than the broker's own work (docs/benchmarks.md, "HTTP API").

Everything about the connection stays uvicorn's (``httpserve.py`` puts the request where its
protocol keeps an ASGI request's cycle): pipelining, keep-alive and its timeout, flow control,
the graceful shutdown. Reading the body keeps the ASGI cycle's rules:
``Expect: 100-continue`` is answered when the endpoint first reads, and an endpoint may answer
before the body has arrived (a 413), whose rest is then read and dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from starlette.convertors import StringConvertor
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import FlowControl

__all__ = ["BodyTooLarge", "ClientGone", "DirectEndpoint", "DirectRequest", "DirectRoute"]

CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class BodyTooLarge(Exception):
    """The request's body is over the limit its endpoint reads it with (declared or sent)."""


class ClientGone(Exception):
    """The client closed the connection before its request's body arrived: nobody to answer."""


DirectEndpoint = Callable[["DirectRequest"], Awaitable[Response]]
# What is checked of every request before its endpoint runs (the HTTP API's: the token).
Check = Callable[["DirectRequest"], None]
# The answer to an Exception the check or the endpoint raised (the HTTP API's: a problem).
Failed = Callable[[Exception, "DirectRequest"], Response]


class DirectRoute(Route):
    """A route :class:`~txbroker.runtime.httpserve.HttpServer` serves itself: ``check`` is
    called with each request, then the endpoint, which takes the :class:`DirectRequest` and
    returns a whole Response (a body, no background task); an Exception either raises is
    answered by ``failed``. The route stays in the app's route table, so another method on its
    path is still the app's 405 with its Allow header, and a path with a trailing slash the
    app's redirect; a request it takes in full never reaches the app (served by another ASGI
    server, the app raises on one)."""

    def __init__(
        self,
        path: str,
        endpoint: DirectEndpoint,
        *,
        methods: list[str],
        check: Check,
        failed: Failed,
    ) -> None:
        super().__init__(path, endpoint, methods=methods)
        self.app = _not_here
        self.check = check
        self.failed = failed
        # Parameters taken as they are (Starlette's str convertor) need no converting.
        self.convert = {
            name: c
            for name, c in self.param_convertors.items()
            if not isinstance(c, StringConvertor)
        }


async def _not_here(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError(f"{scope['path']} is a DirectRoute: serve its app with HttpServer")


class DirectRequest:
    """A direct route's request: what its endpoint reads (the method, the decoded path and
    its raw query, the route's path parameters, :meth:`header`, :meth:`read` for the body,
    ``state`` for what a layer in front of the endpoint learnt), and its state on the
    connection, under the names uvicorn's protocol uses for a request's cycle (``body``
    is the body so far, ``more_body`` whether more is to come)."""

    __slots__ = (
        "_headers",
        "_map",
        "body",
        "disconnected",
        "flow",
        "keep_alive",
        "method",
        "more_body",
        "params",
        "path",
        "query",
        "response_complete",
        "response_started",
        "route",
        "state",
        "transport",
        "version",
        "waiter",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        route: DirectRoute,
        method: str,
        path: str,
        query: bytes,
        params: dict[str, Any],
        headers: list[tuple[bytes, bytes]],
        transport: asyncio.Transport,
        flow: FlowControl,
        version: str,
        keep_alive: bool,
        expect_100_continue: bool,
    ) -> None:
        self.route = route
        self.method = method
        self.path = path
        self.query = query
        self.params = params
        self._headers = headers
        self._map: dict[bytes, bytes] | None = None
        self.state: Any = None
        self.transport = transport
        self.flow = flow
        self.version = version  # HTTP's
        self.keep_alive = keep_alive  # the connection, after this request
        self.waiting_for_100_continue = expect_100_continue
        self.body = bytearray()
        self.more_body = True
        self.disconnected = False
        self.response_started = False
        self.response_complete = False
        self.waiter: asyncio.Future[None] | None = None  # a read waiting for more body

    def header(self, name: bytes) -> str | None:
        """The first value of header ``name`` (lower-case), or None."""
        found = self._map
        if found is None:  # first wins: the list reversed, each earlier one written last
            found = self._map = dict(reversed(self._headers))
        value = found.get(name)
        return None if value is None else value.decode("latin-1")

    @property
    def url(self) -> str:
        """The path and query as the client sent them (for logs and redirects)."""
        return self.path + ("?" + self.query.decode("latin-1") if self.query else "")

    async def read(self, limit: int) -> bytes:
        """The whole body; :class:`BodyTooLarge` past ``limit`` bytes, as soon as the
        Content-Length says so or that much has arrived (the rest is not waited for)."""
        if self.more_body:  # else the common case: it came with the headers
            declared = self.header(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge
            await self._rest(limit)
        if len(self.body) > limit:
            raise BodyTooLarge
        return bytes(self.body)

    async def _rest(self, limit: int) -> None:
        """Until the body has ended, or passed ``limit``."""
        while self.more_body and len(self.body) <= limit:
            if self.disconnected:
                raise ClientGone
            if self.waiting_for_100_continue and not self.transport.is_closing():
                self.transport.write(CONTINUE)
                self.waiting_for_100_continue = False
            self.flow.resume_reading()  # paused when the body outgrew uvicorn's buffer
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def woken(self) -> None:
        """The body grew or ended, or the client left: a read waiting looks again."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def message_event(self) -> _Woken:
        """What uvicorn's protocol calls when the client leaves (``message_event.set()``)."""
        return _Woken(self)


class _Woken:
    __slots__ = ("_request",)

    def __init__(self, request: DirectRequest) -> None:
        self._request = request

    def set(self) -> None:
        self._request.woken()
