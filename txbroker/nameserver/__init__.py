"""The NameServer: topic routes and group masters from etcd to clients, from a watch-fed cache,
over the broker's protocol (ROUTE). Stateless: run several, any one answers."""

from __future__ import annotations

from txbroker.nameserver.cache import RouteCache
from txbroker.nameserver.server import (
    READY_PREFIX,
    NameServer,
    NameServerConfig,
    serve_nameserver,
)

__all__ = ["READY_PREFIX", "NameServer", "NameServerConfig", "RouteCache", "serve_nameserver"]
