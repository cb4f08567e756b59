"""The broker's durable store: commit log, consume queues, key index, group commit, recovery."""

from txbroker.store.config import FlushMode, StoreConfig
from txbroker.store.core import StoreState
from txbroker.store.keyindex import KeyKind
from txbroker.store.maintenance import RetentionReport
from txbroker.store.reads import GetResult
from txbroker.store.record import (
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
    Message,
    RecordFlag,
    StoredMessage,
)
from txbroker.store.recovery import RecoveryReport
from txbroker.store.store import AppendResult, MessageStore

__all__ = [
    # records
    "MAX_BODY_BYTES",
    "MAX_PROPERTIES_BYTES",
    "PROP_IDEMPOTENCY_KEY",
    "PROP_INTERNAL_KEY",
    "PROP_KEYS",
    "PROP_MESSAGE_ID",
    "PROP_TAGS",
    # the store
    "AppendResult",
    "FlushMode",
    "GetResult",
    "KeyKind",
    "Message",
    "MessageStore",
    "RecordFlag",
    "RecoveryReport",
    "RetentionReport",
    "StoreConfig",
    "StoreState",
    "StoredMessage",
]
