"""A real HTTP server (uvicorn) for an ASGI app, on a free local port, inside the test's loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

import uvicorn
from starlette.types import ASGIApp


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # leave the test runner's signals alone


@contextlib.asynccontextmanager
async def serve_app(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app``; yield its base URL (http://127.0.0.1:PORT); stop it after."""
    server = _QuietServer(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.005)  # uvicorn has no "started" event to await
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
