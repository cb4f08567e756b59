"""Every error txbroker raises on purpose descends from :class:`TxbError`.

The tree, with the behaviour each category carries as class attributes::

    TxbError                      code, retriable
    ├── Internal                  a broker bug or unexpected failure (logged server-side)
    ├── InvalidArgument           bad input from a caller: fix the call, never retry
    │   ├── BadRequest            a request body that does not match its schema
    │   ├── InvalidName           topic / group name outside the allowed alphabet or length
    │   ├── MessageTooLarge       body, properties or whole record over its limit
    │   └── InvalidOffset         negative or otherwise impossible offset
    ├── NotFound                  offset, message or queue that does not exist (or no longer)
    │   └── NoRoute               a NameServer knows no route for the topic (not created with
    │                             --groups, or deleted)
    ├── TopicExists               a topic with other settings already exists
    ├── TransactionConflict       a decision that contradicts how the transaction ended
    ├── TooManyTransactions       the open-transaction bound is reached (retriable)
    ├── TransactionNotFound       no such transaction (NotFound)
    ├── StaleGeneration           a consumer's view of its group is out of date (retriable)
    ├── Unauthenticated           missing or wrong auth token: the connection is closed
    ├── Forbidden                 the token lacks the role a request needs on its topic: that
    │                             request is refused, the connection stays open
    ├── ProtocolError             malformed stream: the connection is closed
    │   ├── FrameTooLarge         a frame over MAX_FRAME_BYTES
    │   ├── WrongPort             HTTP met txbroker frames: the address is the other port
    │   └── TlsRequired           a plain client at a TLS listener (connect with txbs://)
    ├── ConnectionLimit           a limit of the broker closed the connection (retriable:
    │   │                         connect again; the SDK does so by itself)
    │   ├── TooManyConnections    every connection slot is taken by authenticated clients
    │   ├── HandshakeTimeout      no HELLO within the deadline, or pushed out by newer ones
    │   ├── IdleTimeout           an authenticated connection sent nothing for too long
    │   └── RateLimited           more frames a second than the broker allows one connection
    ├── ReplicationError          master/slave replication of the commit log
    │   ├── NotMaster             a write sent to a slave: the error names the master
    │   └── ReplicationTimeout    too few slaves acknowledged a write in time (it is stored
    │                             on the master and may still be delivered)
    ├── CoordinationError         the coordination store (etcd) failed or refused a request
    │   ├── CoordinatorUnavailable  no endpoint answered within the deadline (retriable)
    │   └── LeaseExpired          the lease is gone (expired or revoked); its keys with it
    └── StoreError                the store itself is in trouble
        ├── StoreClosed           the store was closed; reopen it
        ├── StoreFailed           an append failed: refused before writing, or the store failed
        ├── CorruptLog            a record failed its checks where the log must be intact
        └── StoreLocked           another process holds the data directory

Codes are stable: they travel on the wire and appear in logs and tests.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadRequest",
    "ConnectionLimit",
    "CoordinationError",
    "CoordinatorUnavailable",
    "CorruptLog",
    "Forbidden",
    "FrameTooLarge",
    "HandshakeTimeout",
    "IdleTimeout",
    "Internal",
    "InvalidArgument",
    "InvalidName",
    "InvalidOffset",
    "LeaseExpired",
    "MessageTooLarge",
    "NoRoute",
    "NotFound",
    "NotMaster",
    "ProtocolError",
    "RateLimited",
    "ReplicationError",
    "ReplicationTimeout",
    "StaleGeneration",
    "StoreClosed",
    "StoreError",
    "StoreFailed",
    "StoreLocked",
    "TooManyConnections",
    "TlsRequired",
    "TooManyTransactions",
    "TopicExists",
    "TransactionConflict",
    "TransactionNotFound",
    "TxbError",
    "Unauthenticated",
    "WrongPort",
    "error_class",
]


class TxbError(Exception):
    """Root of every txbroker error."""

    code: ClassVar[str] = "TXB_ERROR"
    retriable: ClassVar[bool] = False


class InvalidArgument(TxbError):
    code = "INVALID_ARGUMENT"


class BadRequest(InvalidArgument):
    code = "BAD_REQUEST"


class InvalidName(InvalidArgument):
    code = "INVALID_NAME"


class MessageTooLarge(InvalidArgument):
    code = "MESSAGE_TOO_LARGE"


class InvalidOffset(InvalidArgument):
    code = "INVALID_OFFSET"


class NotFound(TxbError):
    code = "NOT_FOUND"


class NoRoute(NotFound):
    code = "NO_ROUTE"


class TransactionConflict(TxbError):
    code = "TRANSACTION_CONFLICT"


class TooManyTransactions(TxbError):
    code = "TOO_MANY_TRANSACTIONS"
    retriable = True


class TransactionNotFound(NotFound):
    code = "TRANSACTION_NOT_FOUND"


class TopicExists(TxbError):
    code = "TOPIC_EXISTS"


class StaleGeneration(TxbError):
    code = "STALE_GENERATION"
    retriable = True


class Unauthenticated(TxbError):
    code = "UNAUTHENTICATED"


class Forbidden(TxbError):
    """The connection's token is valid but lacks the role the request needs on its topic
    (docs/operations.md, "Access control"); the message names the role and the topic."""

    code = "FORBIDDEN"


class ProtocolError(TxbError):
    code = "PROTOCOL_ERROR"


class FrameTooLarge(ProtocolError):
    code = "FRAME_TOO_LARGE"


class WrongPort(ProtocolError):
    """HTTP where txbroker frames belong: a client's frames reached an HTTP port (the broker's
    HTTP port, which answers naming its TCP port), or an HTTP request reached a TCP port (the
    broker answers in HTTP, naming its HTTP port). Not retried: the address is wrong."""

    code = "WRONG_PORT"

    def __init__(self, message: str, seen: bytes = b"") -> None:
        super().__init__(message)
        self.seen = seen  # the first bytes the other side sent (the HTTP answer's head)


class TlsRequired(ProtocolError):
    """A client spoke plain txbroker frames to a listener that serves TLS only; the broker says
    so in plain bytes, once, and closes. Connect with ``txbs://`` (docs/client.md)."""

    code = "TLS_REQUIRED"


class ConnectionLimit(TxbError):
    """The broker closed the connection to protect itself (docs/operations.md, "Connection
    limits"); nothing was wrong with the requests already answered. Connect again."""

    code = "CONNECTION_LIMIT"
    retriable = True


class TooManyConnections(ConnectionLimit):
    code = "TOO_MANY_CONNECTIONS"


class HandshakeTimeout(ConnectionLimit):
    code = "HANDSHAKE_TIMEOUT"


class IdleTimeout(ConnectionLimit):
    code = "IDLE_TIMEOUT"


class RateLimited(ConnectionLimit):
    code = "RATE_LIMITED"


class ReplicationError(TxbError):
    code = "REPLICATION_ERROR"


class NotMaster(ReplicationError):
    """A write (send, transaction, topic change) sent to a slave broker, which only follows
    its master's log; the message names the master to send it to."""

    code = "NOT_MASTER"


class ReplicationTimeout(ReplicationError):
    """With sync replication, fewer than ``min_insync`` slaves reported the write flushed
    within the replication timeout. The write is in the master's log: it may still reach the
    slaves and be delivered, so resend only with an idempotency key."""

    code = "REPLICATION_TIMEOUT"


class CoordinationError(TxbError):
    """The coordination store (etcd, docs/cluster.md) failed a request or answered with an error
    txbroker does not expect; the message names the endpoint and the request."""

    code = "COORDINATION_ERROR"


class CoordinatorUnavailable(CoordinationError):
    """No coordination endpoint answered within the deadline: none is running, it is
    partitioned away, or it is stopped. Try again later (or another endpoint)."""

    code = "COORDINATOR_UNAVAILABLE"
    retriable = True


class LeaseExpired(CoordinationError):
    """The lease expired or was revoked, so every key put under it is deleted: a leadership or
    registration that depended on it is lost and must be campaigned for again."""

    code = "LEASE_EXPIRED"


class StoreError(TxbError):
    code = "STORE_ERROR"


class StoreClosed(StoreError):
    code = "STORE_CLOSED"


class StoreFailed(StoreError):
    """An append failed, and nothing of it is stored. Either a file it needed could not be
    created (a full disk, a quota), so it was refused before anything was written and the next
    append may succeed; or a write or fsync failed, and the store refuses further appends: after
    a failed fsync the page cache state is unknown (the kernel may have dropped the dirty pages),
    so retrying the fsync could report success for data that is gone; the only safe course is
    to stop appending and recover from disk on reopen."""

    code = "STORE_FAILED"


class CorruptLog(StoreError):
    """A record failed its length, magic or CRC check in a region the store had confirmed durable,
    or valid data follows an invalid record (so this is not a torn tail)."""

    code = "CORRUPT_LOG"


class Internal(TxbError):
    """A bug or an unexpected failure inside the broker; the message says what to report."""

    code = "INTERNAL"


class StoreLocked(StoreError):
    code = "STORE_LOCKED"
    retriable = True


def error_class(code: str) -> type[TxbError]:
    """The error class for a wire code (so a client raises what the server raised)."""
    stack: list[type[TxbError]] = [TxbError]
    while stack:
        cls = stack.pop()
        if cls.code == code:
            return cls
        stack.extend(cls.__subclasses__())
    return TxbError
