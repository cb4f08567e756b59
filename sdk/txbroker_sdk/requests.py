"""What a client sends, built without a connection: the broker's (or NameServers') address
parsed, a PREPARE request, and the handle of a prepared transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from txbroker.errors import InvalidArgument
from txbroker.protocol.ids import new_id
from txbroker.protocol.messages import TxEndResponse, TxPrepareRequest

if TYPE_CHECKING:
    from txbroker_sdk.client import Client

__all__ = [
    "DEFAULT_PORT",
    "NAMESERVER_SCHEME",
    "NAMESERVER_TLS_SCHEME",
    "Transaction",
    "is_nameserver_url",
    "parse_nameserver_url",
    "parse_server_url",
    "prepare_request",
    "uses_tls",
]

DEFAULT_PORT: Final = 9876
NAMESERVER_SCHEME: Final = "txbns://"
NAMESERVER_TLS_SCHEME: Final = "txbnss://"  # as txbs:// is to txb://


def parse_server_url(url: str) -> tuple[str, int]:
    """``txb://host:port``, ``txbs://host:port`` (TLS) or ``host:port`` to (host, port)."""
    if is_nameserver_url(url):
        raise InvalidArgument(
            f"{url!r} names NameServers, not a broker: `await Client.connect(url)` returns the "
            "client that routes through them (or make one not connected yet with "
            "txbroker_sdk.cluster.ClusterClient(url))"
        )
    parts = urlsplit(url if "://" in url else f"txb://{url}")
    if parts.scheme not in ("txb", "txbs") or not parts.hostname:
        raise InvalidArgument(
            f"server address must look like txb://host:port (or txbs:// for TLS; NameServers: "
            f"txbns://host:port,... or txbnss:// for TLS, with Client.connect), not {url!r}"
        )
    return parts.hostname, parts.port or DEFAULT_PORT


def is_nameserver_url(url: str) -> bool:
    return url.startswith((NAMESERVER_SCHEME, NAMESERVER_TLS_SCHEME))


def parse_nameserver_url(url: str) -> list[str]:
    """``txbns://h1:9878,h2:9878`` to each NameServer's ``txb://`` address, in order;
    ``txbnss://`` (TLS) to ``txbs://`` addresses."""
    if not is_nameserver_url(url):
        raise InvalidArgument(
            f"NameServers' addresses are txbns://host:port,... (txbnss:// for TLS), not {url!r}"
        )
    scheme, _, rest = url.partition("://")
    parts = [p.strip() for p in rest.split(",")]
    if not all(parts):
        raise InvalidArgument(f"{url!r}: an empty NameServer address")
    each = "txbs" if scheme == "txbnss" else "txb"
    addresses = []
    for part in parts:
        host, port = parse_server_url(f"{each}://{part}")
        addresses.append(f"{each}://{host}:{port}")
    return addresses


def uses_tls(url: str) -> bool:
    """Whether ``url`` asks for TLS: the schemes ``txbs://`` and ``txbnss://``."""
    return url.startswith(("txbs://", NAMESERVER_TLS_SCHEME))


def prepare_request(
    topic: str,
    body: bytes,
    *,
    producer_group: str,
    check_url: str,
    tx_id: str | None = None,
    key: str | None = None,
    tags: str | None = None,
    headers: dict[str, str] | None = None,
    traceparent: str | None = None,
    timeout_ms: int | None = None,
    deliver_at_ms: int | None = None,
) -> TxPrepareRequest:
    """The PREPARE request (:meth:`Client.prepare` sends it and waits; ``@transactional``
    submits it without waiting, to overlap it with the barrier insert)."""
    return TxPrepareRequest(
        topic,
        body,
        producer_group,
        check_url,
        tx_id or new_id(),
        key,
        tags,
        headers or {},
        None,  # message_id: the broker's
        traceparent,
        timeout_ms,
        deliver_at_ms,
    )


class Transaction:
    """A prepared (half) message: invisible until :meth:`commit`; :meth:`rollback` discards it.
    If neither arrives, the broker asks the service's check-back endpoint."""

    __slots__ = ("_client", "message_id", "tx_id")

    def __init__(self, client: Client, tx_id: str, message_id: str) -> None:
        self._client = client
        self.tx_id = tx_id
        self.message_id = message_id

    async def commit(self) -> TxEndResponse:
        return await self._client.end_transaction(self.tx_id, "commit")

    async def rollback(self) -> TxEndResponse:
        return await self._client.end_transaction(self.tx_id, "rollback")
