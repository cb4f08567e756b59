"""Serve an ASGI app with uvicorn inside the caller's event loop, on a chosen or free port.

Used by the broker's HTTP admin, by benchmarks that run a check-back endpoint, and by tests.
uvicorn's own signal handling is switched off: the host program owns SIGTERM/SIGINT (uvicorn
would swap in its handlers while serving and restore the defaults when it stops, so a second
signal during the host's shutdown would kill it mid-flush).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any, ClassVar, cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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

    def _write_now(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

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
    the broker's CPU per HTTP publish, docs/benchmarks.md "HTTP API") without a race the HTTP
    fuzz found (docs/reliability.md, "Fuzzing"): once a request's headers parse, its app
    starts; when the bytes after them are malformed (a bad chunk), uvicorn answers 400 itself
    and closes, but the app's cycle learns of the close only a loop turn later, so the app's own
    answer met a finished connection and was logged as "Exception in ASGI application". Marking
    the cycle disconnected first drops that answer, as for a client that left.

    ``not_http_note`` is added to the 400 answer's text (``HttpServer``'s ``not_http_note``)."""

    not_http_note: ClassVar[str] = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _TurnTransport(transport)))

    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        if cycle and not cycle.response_complete:
            cycle.disconnected = True
            if cycle.response_started:  # the app's answer is half sent: no 400 can follow it
                self.transport.close()
                return
        super().send_400_response(f"{msg} {self.not_http_note}" if self.not_http_note else msg)


def _noted(note: str) -> type[_HttpProtocol]:
    """The protocol class with ``note`` (uvicorn makes a protocol from a class, per connection)."""

    class _NotedProtocol(_HttpProtocol):
        not_http_note = note

    return _NotedProtocol


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
        broker names its TCP port there, for a client that connected here by mistake)."""
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
            http=_noted(not_http_note) if not_http_note else _HttpProtocol,
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
