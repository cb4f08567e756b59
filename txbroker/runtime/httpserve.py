"""Serve an ASGI app with uvicorn inside the caller's event loop, on a chosen or free port.

Used by the broker's HTTP admin, by benchmarks that run a check-back endpoint, and by tests.
uvicorn's own signal handling is switched off: the host program owns SIGTERM/SIGINT (uvicorn
would swap in its handlers while serving and restore the defaults when it stops, so a second
signal during the host's shutdown would kill it mid-flush).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import ASGIApp

__all__ = ["HttpServer", "serving"]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    def __init__(self, app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
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
