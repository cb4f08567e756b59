"""Every error a service may catch, under one root: the broker's (raised on this side from the
code in its answer) and the SDK's own. ``retriable`` (* below) says whether trying again can
help; ``code`` is stable. ``A > B, C``: B and C are kinds of A, caught with it.

    TxbError
    ├── InvalidArgument > BadRequest, InvalidName, MessageTooLarge, InvalidOffset
    ├── NotFound > NoRoute, TransactionNotFound
    ├── ProtocolError > TlsRequired, WrongPort
    ├── ReplicationError > NotMaster, ReplicationTimeout
    ├── ConnectionClosed* > BrokerUnreachable*
    ├── RequestTimeout*, TlsFailed, TopicExists, TransactionConflict, TooManyTransactions*,
    │   StaleGeneration*, Unauthenticated, Forbidden, StoreError, Internal
    └── TransactionFenced, TablesMissing, NotStarted: found in the service, not at the broker
"""

from __future__ import annotations

from collections.abc import Sequence

from txbroker.errors import (
    BadRequest,
    Forbidden,
    Internal,
    InvalidArgument,
    InvalidName,
    InvalidOffset,
    MessageTooLarge,
    NoRoute,
    NotFound,
    NotMaster,
    ProtocolError,
    ReplicationError,
    ReplicationTimeout,
    StaleGeneration,
    StoreError,
    TlsRequired,
    TooManyTransactions,
    TopicExists,
    TransactionConflict,
    TransactionNotFound,
    TxbError,
    Unauthenticated,
    WrongPort,
)

__all__ = [
    "TxbError",
    # a call to fix, not to retry
    "InvalidArgument",
    "BadRequest",
    "InvalidName",
    "MessageTooLarge",
    "InvalidOffset",
    "NotFound",
    "NoRoute",
    "TransactionNotFound",
    "TopicExists",
    "TransactionConflict",
    "Unauthenticated",
    "Forbidden",
    # the broker's state
    "TooManyTransactions",
    "StaleGeneration",
    "ReplicationError",
    "NotMaster",
    "ReplicationTimeout",
    "StoreError",
    "Internal",
    # the connection
    "ConnectionClosed",
    "BrokerUnreachable",
    "RequestTimeout",
    "ProtocolError",
    "TlsRequired",
    "WrongPort",
    "TlsFailed",
    # the service's side
    "TransactionFenced",
    "TablesMissing",
    "NotStarted",
]


class ConnectionClosed(TxbError):
    """The connection is gone: requests in flight have an unknown outcome (resend with an
    idempotency key); the next request connects again."""

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
    """No answer within the request's timeout: its outcome is unknown."""

    code = "REQUEST_TIMEOUT"
    retriable = True


class TransactionFenced(TxbError):
    """A back-check already answered ROLLBACK for this transaction: the business transaction
    must roll back too (it would otherwise commit data whose message was discarded)."""

    code = "TRANSACTION_FENCED"


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


class NotStarted(TxbError):
    """A ``TxbService`` dependency or decorated function used outside the service's lifespan:
    nothing is connected."""

    code = "NOT_STARTED"
