"""Coordinator addresses: ``etcd://host:port[,host:port...]``, as ``--coordinator`` takes them.

One URL names every member of one etcd cluster, so a broker or NameServer started with it can
reach whichever member answers. Parsing is strict: a typo in an address should stop a process at
start, not leave it retrying a host that does not exist.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from txbroker.errors import InvalidArgument

__all__ = ["SCHEMES", "CoordinatorUrl", "Endpoint", "parse_coordinator_url"]

SCHEMES: Final = ("etcd",)
# etcd's own client port (IANA-registered), used when an address names no port.
ETCD_DEFAULT_PORT: Final = 2379


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class CoordinatorUrl:
    scheme: str
    endpoints: tuple[Endpoint, ...]

    def __str__(self) -> str:
        return f"{self.scheme}://{','.join(str(e) for e in self.endpoints)}"


def parse_coordinator_url(url: str) -> CoordinatorUrl:
    """``etcd://127.0.0.1:2379,127.0.0.1:22379`` to its scheme and endpoints, in order.

    >>> parse_coordinator_url("etcd://10.0.0.1:2379,[::1]").endpoints[1]
    Endpoint(host='::1', port=2379)
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise InvalidArgument(
            f"coordinator URL {url!r}: expected {' or '.join(s + '://' for s in SCHEMES)}"
            "host:port[,host:port...]"
        )
    if any(c in rest for c in "/?#@"):
        raise InvalidArgument(
            f"coordinator URL {url!r}: only host:port pairs may follow {scheme}:// "
            "(no path, query, credentials)"
        )
    endpoints = tuple(_endpoint(url, part) for part in rest.split(","))
    if len(set(endpoints)) != len(endpoints):
        raise InvalidArgument(f"coordinator URL {url!r}: an endpoint is named twice")
    return CoordinatorUrl(scheme.lower(), endpoints)


def _endpoint(url: str, part: str) -> Endpoint:
    part = part.strip()
    if part.startswith("["):  # [IPv6]:port or [IPv6]
        host, sep, tail = part[1:].partition("]")
        if not sep or (tail and not tail.startswith(":")):
            raise InvalidArgument(f"coordinator URL {url!r}: bad IPv6 address {part!r}")
        port_text = tail[1:] if tail else ""
    else:
        host, _, port_text = part.partition(":")
        if ":" in port_text:
            raise InvalidArgument(
                f"coordinator URL {url!r}: write an IPv6 address in brackets, as [{part}]:2379"
            )
    if not host:
        raise InvalidArgument(f"coordinator URL {url!r}: an endpoint has no host")
    if not port_text:
        return Endpoint(host, ETCD_DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(
            f"coordinator URL {url!r}: port {port_text!r} of {host} is not in 1..65535"
        )
    return Endpoint(host, int(port_text))
