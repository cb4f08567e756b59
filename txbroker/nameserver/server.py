"""The NameServer process: routes from etcd to clients, over the broker's own protocol.

It speaks the broker's wire protocol (HELLO, PING and ROUTE) with the broker's connection object,
so a client asks a NameServer as it asks a broker, with the SDK's framing, pipelining,
deadlines, reconnects, TLS and typed errors, and the connection's bounds hold here too
(docs/cluster.md, "The NameServer", says why not HTTP JSON). Answers come from
:class:`~txbroker.nameserver.cache.RouteCache`, kept current by a watch; the NameServer holds no
state of its own, so several can run and any one answers.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any, Final

from txbroker import __version__
from txbroker.cluster import Coordinator, connect_coordinator
from txbroker.nameserver.cache import RouteCache
from txbroker.protocol.frames import PROTOCOL_VERSION, Opcode
from txbroker.protocol.messages import Empty, Hello, HelloOk, RouteRequest, RouteResponse
from txbroker.runtime.signals import stop_on_signals
from txbroker.server.connection import Connection, Handler

__all__ = ["READY_PREFIX", "NameServer", "NameServerConfig", "serve_nameserver"]

log = logging.getLogger(__name__)

READY_PREFIX: Final = "txbroker nameserver ready"
# The first listing of /txb/ must come within this: a NameServer that cannot see etcd at start
# has nothing to serve, and should say so rather than answer NO_ROUTE for every topic.
FIRST_LISTING_TIMEOUT_S: Final = 10.0
# What the OS queues before accept (as the broker's, server/app.py).
ACCEPT_BACKLOG: Final = 1024


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    coordinator: str  # etcd://host:port[,host:port...]
    host: str = "127.0.0.1"
    port: int = 9878


class NameServer:
    """Serve ROUTE from a watch-fed view of etcd.

    ::

        ns = NameServer(NameServerConfig("etcd://127.0.0.1:2379", port=0))
        await ns.start()  # listening once the first listing is in
        ...
        await ns.stop()
    """

    def __init__(self, config: NameServerConfig) -> None:
        self.config = config
        self.port = 0
        self.cache: RouteCache | None = None
        self._coordinator: Coordinator | None = None
        self._feeding: asyncio.Task[None] | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()

    async def start(self) -> None:
        coordinator = self._coordinator = await connect_coordinator(self.config.coordinator)
        cache = self.cache = RouteCache(coordinator)
        self._feeding = asyncio.create_task(cache.run(), name="txb-nameserver-watch")
        try:
            async with asyncio.timeout(FIRST_LISTING_TIMEOUT_S):
                await cache.ready.wait()
        except TimeoutError:
            await self.stop()
            raise
        handlers: dict[int, Handler] = {Opcode.PING: _ping, Opcode.ROUTE: self._route}

        def hello(_: Hello) -> HelloOk:
            return HelloOk(__version__, PROTOCOL_VERSION)

        def connection() -> Connection:
            return Connection(handlers, hello=hello, connections=self._connections)

        self._server = await asyncio.get_running_loop().create_server(
            connection,
            self.config.host,
            self.config.port,
            reuse_address=True,
            backlog=ACCEPT_BACKLOG,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    def _route(self, req: RouteRequest) -> RouteResponse:
        assert self.cache is not None
        return self.cache.route(req.topic)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for c in list(self._connections):
                c.closing = True
                if c._transport is not None:
                    c._transport.close()
            await self._server.wait_closed()
        if self._feeding is not None:
            self._feeding.cancel()
            await asyncio.gather(self._feeding, return_exceptions=True)
        if self._coordinator is not None:
            await self._coordinator.close()


def _ping(_: Any) -> Empty:
    return Empty()


async def serve_nameserver(config: NameServerConfig) -> None:
    """Run a NameServer until SIGTERM / SIGINT; the ready line names its address."""
    ns = NameServer(config)
    await ns.start()
    stop = stop_on_signals()
    print(
        f"{READY_PREFIX} tcp={config.host}:{ns.port} coordinator={config.coordinator}",
        flush=True,
    )
    await stop.wait()
    await ns.stop()
    print("txbroker nameserver stopped", file=sys.stderr, flush=True)
