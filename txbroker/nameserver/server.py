"""The NameServer process: routes from etcd to clients, over the broker's own protocol.

It speaks the broker's wire protocol (HELLO, PING and ROUTE) with the broker's connection object,
so a client asks a NameServer as it asks a broker, with the SDK's framing, pipelining,
deadlines, reconnects, TLS and typed errors, and the connection's bounds hold here too
(docs/cluster.md, "The NameServer", says why not HTTP JSON). Its tokens and TLS are the broker's
too: the same token table checks HELLO and the same rules (``server/access.py``) each ROUTE,
and a TLS NameServer listens as a TLS broker does (``server/tlslisten.py``). Answers come from
:class:`~txbroker.nameserver.cache.RouteCache`, kept current by a watch; the NameServer holds no
state of its own, so several can run and any one answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from txbroker import __version__
from txbroker.cluster import Coordinator, connect_coordinator
from txbroker.errors import InvalidArgument
from txbroker.nameserver.cache import RouteCache
from txbroker.protocol.frames import PROTOCOL_VERSION, Opcode
from txbroker.protocol.messages import Empty, Hello, HelloOk, RouteRequest, RouteResponse
from txbroker.runtime.fdlimit import open_files, raise_nofile_limit
from txbroker.runtime.signals import stop_on_signals
from txbroker.runtime.tls import TlsFiles, server_context
from txbroker.server.access import Access
from txbroker.server.admission import Admission, Limits, checked_limits, fit_limits
from txbroker.server.connection import Connection, Handler
from txbroker.server.tlslisten import TlsListener
from txbroker.server.tokens import TokenTable

__all__ = ["READY_PREFIX", "NameServer", "NameServerConfig", "serve_nameserver"]

log = logging.getLogger(__name__)

READY_PREFIX: Final = "txbroker nameserver ready"
# The first listing of /txb/ must come within this: a NameServer that cannot see etcd at start
# has nothing to serve, and should say so rather than answer NO_ROUTE for every topic.
FIRST_LISTING_TIMEOUT_S: Final = 10.0
# What the OS queues before accept (as the broker's, server/app.py).
ACCEPT_BACKLOG: Final = 1024
# Descriptors kept free beside the connections: etcd's channel, the log, a margin.
FILES_KEPT: Final = 64


@dataclass(frozen=True, slots=True)
class NameServerConfig:
    """What ``txbroker nameserver`` takes; the token and TLS settings mean what the broker's
    do (``txbroker serve``): clients present ``auth_token`` in HELLO; with ``tls_cert`` and
    ``tls_key`` it serves TLS (clients connect with ``txbnss://``), with ``tls_client_ca``
    mutual TLS."""

    coordinator: str  # etcd://host:port[,host:port...]
    host: str = "127.0.0.1"
    port: int = 9878
    auth_token: str | None = field(default=None, repr=False)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # The broker's connection limits (server/admission.py), with its defaults: a flood of
    # sockets that never say HELLO cannot lock a service out of its routes.
    limits: Limits = field(default_factory=checked_limits)

    def __post_init__(self) -> None:
        if self.auth_token == "":
            raise InvalidArgument("auth_token must not be empty (omit it to run without auth)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key (TLS itself)")

    @property
    def tls(self) -> TlsFiles | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        return TlsFiles(self.tls_cert, self.tls_key, self.tls_client_ca)


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
        self._server: asyncio.Server | TlsListener | None = None
        self._connections: set[Connection] = set()
        self.admission: Admission | None = None

    async def start(self) -> None:
        tls = self.config.tls
        context = server_context(tls) if tls is not None else None  # bad files: before etcd
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
        # No transactions here: a transaction's topic is never known.
        access = Access(TokenTable.build(self.config.auth_token, ()), lambda _: None)

        def hello(_: Hello) -> HelloOk:
            return HelloOk(__version__, PROTOCOL_VERSION, access.tokens.required)

        limits = self.config.limits
        free = raise_nofile_limit().soft - open_files() - FILES_KEPT
        most, reserved = fit_limits(limits.max_connections, limits.reserved, free)
        if most < limits.max_connections:
            log.warning(
                "connections: at most %d (%d reserved), lowered from %d: the open-file limit "
                "leaves no more; raise the hard limit (ulimit -Hn, LimitNOFILE=)",
                most,
                reserved,
                limits.max_connections,
            )
            limits = dataclasses.replace(limits, max_connections=most, reserved=reserved)
        admission = self.admission = Admission(limits)
        admission.start()

        def connection() -> Connection:
            return Connection(
                handlers,
                access=access,
                hello=hello,
                connections=self._connections,
                admission=admission,
            )

        host, port = self.config.host, self.config.port
        if context is not None:
            listener = TlsListener(
                connection,
                context,
                handshake_timeout_s=limits.handshake_timeout_s,
                pending_max=limits.max_connections - limits.reserved,
                refusal="this NameServer serves TLS on this port: connect with "
                "txbnss://host:port (docs/cluster.md, 'Security')",
            )
            listener.listen(host, port, ACCEPT_BACKLOG)
            self._server = listener
        else:
            self._server = await asyncio.get_running_loop().create_server(
                connection, host, port, reuse_address=True, backlog=ACCEPT_BACKLOG
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
        if self.admission is not None:
            await self.admission.stop()
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
    tls = " tls=on" if config.tls is not None else ""
    print(
        f"{READY_PREFIX} tcp={config.host}:{ns.port} coordinator={config.coordinator}{tls}",
        flush=True,
    )
    await stop.wait()
    await ns.stop()
    print("txbroker nameserver stopped", file=sys.stderr, flush=True)
