"""Coordination of broker groups on etcd (docs/cluster.md): the interface the rest of txbroker
uses, the primitives built on it, and :func:`connect_coordinator` to open one from a URL.

The engine's client (``aetcd``, the ``cluster`` extra) is imported only by
:func:`connect_coordinator`, so ``txbroker`` without the extra still imports this package.
"""

from __future__ import annotations

from txbroker.cluster.coordination import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Coordinator,
    EventKind,
    KeyValue,
    Lease,
    Listing,
    Watch,
    WatchEvent,
)
from txbroker.cluster.election import Election, ElectionState, Term, watch_leader
from txbroker.cluster.lease import LeaseKeeper, LeaseState
from txbroker.cluster.registration import Registration, RegistrationState
from txbroker.cluster.url import CoordinatorUrl, Endpoint, parse_coordinator_url
from txbroker.errors import CoordinationError

__all__ = [
    # The interface.
    "Coordinator",
    "EventKind",
    "KeyValue",
    "Lease",
    "Listing",
    "Watch",
    "WatchEvent",
    # Primitives on it.
    "Election",
    "ElectionState",
    "LeaseKeeper",
    "LeaseState",
    "Registration",
    "RegistrationState",
    "Term",
    "watch_leader",
    # Addresses and sessions.
    "DEFAULT_REQUEST_TIMEOUT_S",
    "CoordinatorUrl",
    "Endpoint",
    "connect_coordinator",
    "parse_coordinator_url",
]


async def connect_coordinator(
    url: str, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> Coordinator:
    """A session with the coordination store at ``url`` (``etcd://host:port[,host:port...]``),
    once one of its endpoints answered (``CoordinatorUnavailable`` after ``request_timeout_s``
    when none does)."""
    parsed = parse_coordinator_url(url)
    try:
        from txbroker.cluster.etcd import connect_etcd
    except ImportError as e:  # the client is the `cluster` extra
        raise CoordinationError(
            f"{url}: the etcd client is not installed (pip install 'txbroker[cluster]'): {e}"
        ) from e
    return await connect_etcd(parsed, request_timeout_s=request_timeout_s)
