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
    ├── TopicExists               a topic with other settings already exists
    ├── TransactionConflict       a decision that contradicts how the transaction ended
    ├── TooManyTransactions       the open-transaction bound is reached (retriable)
    ├── TransactionNotFound       no such transaction (NotFound)
    ├── StaleGeneration           a consumer's view of its group is out of date (retriable)
    ├── Unauthenticated           missing or wrong auth token: the connection is closed
    ├── ProtocolError             malformed stream: the connection is closed
    │   └── FrameTooLarge         a frame over MAX_FRAME_BYTES
    └── StoreError                the store itself is in trouble
        ├── StoreClosed           the store was closed; reopen it
        ├── StoreFailed           an fsync or write failed; the store refuses further appends
        ├── CorruptLog            a record failed its checks where the log must be intact
        └── StoreLocked           another process holds the data directory

Codes are stable: they travel on the wire (issue 3) and appear in logs and tests.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadRequest",
    "CorruptLog",
    "FrameTooLarge",
    "Internal",
    "InvalidArgument",
    "InvalidName",
    "InvalidOffset",
    "MessageTooLarge",
    "NotFound",
    "ProtocolError",
    "StaleGeneration",
    "StoreClosed",
    "StoreError",
    "StoreFailed",
    "StoreLocked",
    "TooManyTransactions",
    "TopicExists",
    "TransactionConflict",
    "TransactionNotFound",
    "TxbError",
    "Unauthenticated",
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


class ProtocolError(TxbError):
    code = "PROTOCOL_ERROR"


class FrameTooLarge(ProtocolError):
    code = "FRAME_TOO_LARGE"


class StoreError(TxbError):
    code = "STORE_ERROR"


class StoreClosed(StoreError):
    code = "STORE_CLOSED"


class StoreFailed(StoreError):
    """A write or fsync failed. After a failed fsync the page cache state is unknown (the kernel
    may have dropped the dirty pages), so retrying the fsync could report success for data that
    is gone; the only safe course is to stop appending and recover from disk on reopen."""

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
