"""Serve an ASGI app with uvicorn inside the caller's event loop, on a chosen or free port.

Used by the broker's HTTP admin, by benchmarks that run a check-back endpoint, and by tests.
uvicorn's own signal handling is switched off: the host program owns SIGTERM/SIGINT (uvicorn
would swap in its handlers while serving and restore the defaults when it stops, so a second
signal during the host's shutdown would kill it mid-flush). The app's
:class:`~txbroker.runtime.httpdirect.DirectRoute` s are answered by the HTTP protocol itself,
past the ASGI layers (``httpdirect.py``); every other request goes through the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Final, cast

import httptools
import uvicorn
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import (
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

from txbroker.runtime.httpdirect import ClientGone, DirectRequest, DirectRoute
from txbroker.runtime.tls import TlsFiles
from txbroker.runtime.turnwriter import TurnWriter

__all__ = ["HttpServer", "serving"]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _TurnTransport:
    """A transport whose writes made in one turn of the event loop leave in one ``send``
    (``turnwriter.py``, as the TCP port's answers do): uvicorn writes a response's head and its
    body separately, two system calls and two wake-ups of the client where one will do.
    Everything else is the transport's own."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._out = TurnWriter(asyncio.get_running_loop(), self._write_now)

    def write(self, data: bytes) -> None:
        if data:
            self._out.add(data)

    def write_now(self, data: bytes) -> None:
        """A whole answer (a direct route's): out now, after what is queued."""
        self._out.write_now(data)

    def _write_now(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

    def is_closing(self) -> bool:  # asked at every answer: not through __getattr__
        return self._transport.is_closing()

    def close(self) -> None:
        self._out.flush()  # what was written before the close still goes out, first
        self._transport.close()

    def abort(self) -> None:
        self._out.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol (the C parser: h11, pure Python, cost about a quarter of
    the broker's CPU per HTTP publish, docs/benchmarks.md "HTTP API"), answering the app's
    direct routes itself (``httpdirect.py``), and without a race the HTTP fuzz found
    (docs/reliability.md, "Fuzzing"): once a request's headers parse, its app starts; when the
    bytes after them are malformed (a bad chunk), uvicorn answers 400 itself and closes, but
    the app's cycle learns of the close only a loop turn later, so the app's own answer met a
    finished connection and was logged as "Exception in ASGI application". Marking the cycle
    disconnected first drops that answer, as for a client that left.

    A direct request is kept where uvicorn keeps an ASGI request's cycle (``self.cycle``, and
    its pipeline), with the attributes uvicorn's protocol reads and writes there, so the rest
    of the protocol goes on as for any request: a pipelined request started once the answers
    before it are complete, keep-alive, the client leaving, the shutdown.

    ``not_http_note`` is added to the 400 answer's text (``HttpServer``'s ``not_http_note``)."""

    def __init__(
        self,
        *args: Any,
        direct: Sequence[DirectRoute] = (),
        not_http_note: str = "",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._not_http_note = not_http_note
        self._lost = False
        # The task answering the connection's direct requests, the request it takes next, and
        # what it waits on while there is none.
        self._direct_worker: asyncio.Task[None] | None = None
        self._direct_next: DirectRequest | None = None
        self._direct_waiting: asyncio.Future[None] | None = None
        self._direct = direct
        self._direct_methods = frozenset(m.encode() for r in direct for m in r.methods or ())

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._turns = _TurnTransport(transport)
        super().connection_made(cast(asyncio.Transport, self._turns))

    def on_message_begin(self) -> None:
        # What uvicorn's on_message_begin sets, but its ASGI scope: _to_app makes that, for a
        # request that goes to the app.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []

    def _to_app(self) -> None:
        """The request, its headers parsed, to uvicorn's ASGI cycle and the app."""
        url, headers, expect_100_continue = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.expect_100_continue = url, expect_100_continue
        self.headers = self.scope["headers"] = headers
        super().on_headers_complete()

    def on_headers_complete(self) -> None:
        parser = self.parser
        method = parser.get_method()
        # A WebSocket upgrade is the app's; any other Upgrade (h2c) is not taken up, by uvicorn
        # either, and the request is answered as it stands.
        if method not in self._direct_methods or (
            parser.should_upgrade() and self._should_upgrade()
        ):
            self._to_app()
            return
        # The request line as uvicorn reads it for the ASGI scope.
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        verb = method.decode("ascii")
        found = self._route(verb, self.root_path + path)
        if found is None:
            self._to_app()
            return
        route, params = found
        version = parser.get_http_version()
        request = DirectRequest(
            route,
            verb,
            path,
            url.query or b"",
            params,
            self.headers,
            self.transport,
            self.flow,
            version,
            version != "1.0" and parser.should_keep_alive(),
            self.expect_100_continue,
        )
        before = self.cycle
        as_uvicorns: Any = request  # it has the attributes uvicorn's protocol uses of a cycle
        self.cycle = as_uvicorns
        if before is None or before.response_complete:
            self._start_direct(request)
        else:  # pipelined: started when the answers before it are complete
            self.flow.pause_reading()
            self.pipeline.appendleft((as_uvicorns, self.app))

    def _route(self, method: str, path: str) -> tuple[DirectRoute, dict[str, Any]] | None:
        """The direct route taking ``method`` on ``path``, matched as Starlette's router
        matches a route (its path regex and parameter convertors), and its path parameters."""
        for route in self._direct:
            match = route.path_regex.match(path)
            if match is not None and route.methods is not None and method in route.methods:
                params: dict[str, Any] = match.groupdict()
                for name, convertor in route.convert.items():
                    params[name] = convertor.convert(params[name])
                return route, params
        return None

    def on_body(self, body: bytes) -> None:
        request: Any = self.cycle
        if type(request) is not DirectRequest:
            super().on_body(body)
        elif not request.response_complete:  # else answered early: the rest is dropped
            request.body += body
            if len(request.body) > HIGH_WATER_LIMIT:
                self.flow.pause_reading()  # as uvicorn's: the endpoint's read resumes it
            request.woken()

    def on_message_complete(self) -> None:
        request: Any = self.cycle
        if type(request) is not DirectRequest:
            super().on_message_complete()
        elif not request.response_complete:
            request.more_body = False
            request.woken()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        request: Any = cycle  # uvicorn's pipeline holds both kinds
        if type(request) is DirectRequest:  # a pipelined direct request, its turn come
            self._start_direct(request)
        else:
            super()._start_asgi_task(cycle, app)

    def _start_direct(self, request: DirectRequest) -> None:
        """``request`` to the connection's direct worker, made at its first direct request:
        a connection answers one request at a time, so one task serves all its direct
        requests (a task made per request cost as much as parsing it)."""
        self._direct_next = request
        waiting = self._direct_waiting
        if waiting is not None:
            self._direct_waiting = None
            waiting.set_result(None)
        elif self._direct_worker is None:
            self._direct_worker = task = self.loop.create_task(self._serve_direct_requests())
            task.add_done_callback(self.tasks.discard)  # the shutdown waits for these tasks
            self.tasks.add(task)

    async def _serve_direct_requests(self) -> None:
        """The connection's direct requests, each as it comes, until the connection is lost."""
        while not self._lost:
            request = self._direct_next
            if request is None:
                self._direct_waiting = self.loop.create_future()
                await self._direct_waiting
                continue
            self._direct_next = None
            await self._serve_direct(request)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        waiting = self._direct_waiting
        if waiting is not None:  # the worker ends
            self._direct_waiting = None
            waiting.set_result(None)
        super().connection_lost(exc)

    async def _serve_direct(self, request: DirectRequest) -> None:
        """The endpoint's answer; its Exception answered by the route's ``failed``; anything
        else that escapes it, or a failure to answer, logged and answered 500 (the connection
        closed instead once an answer has begun), as uvicorn does for an app."""
        route = request.route
        try:
            try:
                route.check(request)
                response = await route.endpoint(request)
            except Exception as e:
                if type(e) is ClientGone:
                    return
                response = route.failed(e, request)
            if request.disconnected:
                return
            if self.flow.write_paused:
                await self.flow.drain()  # the client reads its answers slower than it asks
            self._respond(request, response)
        except BaseException as exc:
            self.logger.error("Exception in direct route %s", route.path, exc_info=exc)
            if request.response_started or request.disconnected:
                self.transport.close()
                return
            request.keep_alive = False
            self._respond(request, _INTERNAL_ERROR)

    def _respond(self, request: DirectRequest, response: Response) -> None:
        """The response in one write, as uvicorn's cycle writes an app's: its status line, the
        server's default headers, the response's, ``connection: close`` when the connection
        ends with it; then the next pipelined request, or the keep-alive timeout."""
        assert response.background is None, "a direct route's response has no background task"
        status = response.status_code
        if self.access_log and self.access_logger.isEnabledFor(logging.INFO):
            who = f"{self.client[0]}:{self.client[1]}" if self.client else ""
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d', who, request.method, request.url, request.version, status
            )
        headers = response.raw_headers
        for name, value in headers:
            if name not in _MADE_HERE and HEADER_VALUE_RE.search(value):
                raise RuntimeError(f"invalid value of response header {name!r}")
        request.response_started = True
        request.waiting_for_100_continue = False
        self._turns.write_now(
            b"%s%s%s\r\n%s\r\n%s"
            % (
                STATUS_LINE[status],
                _DEFAULT_LINES.of(self.server_state),
                b"\r\n".join(map(b": ".join, headers)),
                b"" if request.keep_alive else b"connection: close\r\n",
                response.body if request.method != "HEAD" else b"",
            )
        )
        request.response_complete = True
        if not request.keep_alive:
            self.transport.close()
        self.on_response_complete()

    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        if cycle and not cycle.response_complete:
            cycle.disconnected = True
            if cycle.response_started:  # the app's answer is half sent: no 400 can follow it
                self.transport.close()
                return
        note = self._not_http_note
        super().send_400_response(f"{msg} {note}" if note else msg)


# Response headers whose values Starlette's Response makes itself from a length and a media
# type: no line break can be in them, so they skip the check of every other header's value.
_MADE_HERE: Final = frozenset({b"content-length", b"content-type"})


class _DefaultLines:
    """uvicorn's default response headers (date and server; it replaces the list every second)
    as header lines, joined once per list rather than once per response."""

    __slots__ = ("_lines", "_of")

    def __init__(self) -> None:
        self._of: object = None
        self._lines = b""

    def of(self, state: ServerState) -> bytes:
        headers = state.default_headers
        if headers is not self._of:
            self._of, self._lines = headers, b"".join(b"%s: %s\r\n" % h for h in headers)
        return self._lines


_DEFAULT_LINES: Final = _DefaultLines()

# What uvicorn answers when an app fails before answering.
_INTERNAL_ERROR: Final = PlainTextResponse("Internal Server Error", 500)


class HttpServer:
    def __init__(
        self,
        app: ASGIApp,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls: TlsFiles | None = None,
        not_http_note: str = "",
    ) -> None:
        """``tls``: serve HTTPS with these files (mutual TLS with a client CA).
        ``not_http_note``: ASCII text added to the 400 answer to bytes that are not HTTP (the
        broker names its TCP port there, for a client that connected here by mistake). The
        app's :class:`DirectRoute` s (of its own route table, ``app.routes``) are answered by
        the protocol itself."""
        direct = [r for r in getattr(app, "routes", ()) if isinstance(r, DirectRoute)]
        ssl_options: dict[str, Any] = {}
        if tls is not None:
            ssl_options = {
                "ssl_certfile": str(tls.cert),
                "ssl_keyfile": str(tls.key),
                "ssl_ca_certs": str(tls.client_ca) if tls.client_ca else None,
                "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.client_ca else ssl.CERT_NONE,
            }
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="off",
            # uvicorn calls this as it calls a protocol class: with its config and state.
            http=cast(
                "type[asyncio.Protocol]",
                functools.partial(_HttpProtocol, direct=direct, not_http_note=not_http_note),
            ),
            **ssl_options,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self, timeout_s: float = 10) -> None:
        """Start serving; return once bound (raising the bind error if it fails)."""
        self._task = asyncio.create_task(self._server.serve(), name="txb-http")
        async with asyncio.timeout(timeout_s):
            while not self._server.started:
                if self._task.done():
                    self._task.result()  # the bind error (port in use, ...)
                    raise RuntimeError("the HTTP server stopped before it started")
                await asyncio.sleep(0.005)  # uvicorn offers no "started" event to await
        self.port = self._server.servers[0].sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


@contextlib.asynccontextmanager
async def serving(app: ASGIApp, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve ``app`` on a free port for the duration; yield its base URL."""
    server = HttpServer(app, host)
    await server.start()
    try:
        yield f"http://{host}:{server.port}"
    finally:
        await server.stop()
