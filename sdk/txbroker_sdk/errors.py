"""The errors the SDK raises on the service's side (the broker's own come from
``txbroker.errors`` over the wire); each descends from :class:`~txbroker.errors.TxbError`.

No SQLAlchemy here: a process that only sends messages imports these too.
"""

from __future__ import annotations

from collections.abc import Sequence

from txbroker.errors import TxbError

__all__ = ["BrokerUnreachable", "ConnectionClosed", "RequestTimeout", "TablesMissing", "TlsFailed"]


class ConnectionClosed(TxbError):
    code = "CONNECTION_CLOSED"
    retriable = True


class BrokerUnreachable(ConnectionClosed):
    """No connection to the broker's address within the client's connect (or reconnect)
    deadline; the message names the address and the last failure."""

    code = "BROKER_UNREACHABLE"


class TlsFailed(TxbError):
    """A ``txbs://`` connection failed its TLS handshake: the broker's certificate is not
    trusted (pass ``tls_ca``) or does not name the host, the broker wants a client certificate
    (``tls_cert``, ``tls_key``), or it does not serve TLS. Not retried: it will fail again."""

    code = "TLS_FAILED"


class RequestTimeout(TxbError):
    code = "REQUEST_TIMEOUT"
    retriable = True


class TablesMissing(TxbError):
    """The service's database lacks txbroker's tables (``txb_*``): it was never migrated.
    Found once, when a component starts, rather than as SQL errors on every transaction."""

    code = "TABLES_MISSING"

    def __init__(self, url: str, missing: Sequence[str]) -> None:
        self.url = url  # without its password
        self.missing = tuple(missing)
        super().__init__(
            f"the txbroker tables are missing in {url}: run `txbroker db upgrade --url {url}` "
            f"(not found: {', '.join(self.missing)})"
        )
