"""The broker's durable store: commit log, consume queues, key index, group commit, recovery,
and the fences that delete a topic's records (docs/store.md)."""

from txbroker.store.append import AppendResult
from txbroker.store.config import FlushMode, StoreConfig
from txbroker.store.fences import TopicFence
from txbroker.store.keyindex import KeyKind
from txbroker.store.reads import GetResult
from txbroker.store.record import (
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_ORIGINAL_TOPIC,
    PROP_TAGS,
    PROP_TARGET_TOPIC,
    Message,
    RecordFlag,
    StoredMessage,
)
from txbroker.store.recovery import RecoveryReport
from txbroker.store.retention import RetentionHook, RetentionReport
from txbroker.store.state import StoreState
from txbroker.store.store import MessageStore

__all__ = [
    # records
    "MAX_BODY_BYTES",
    "MAX_PROPERTIES_BYTES",
    "PROP_IDEMPOTENCY_KEY",
    "PROP_INTERNAL_KEY",
    "PROP_KEYS",
    "PROP_MESSAGE_ID",
    "PROP_ORIGINAL_TOPIC",
    "PROP_TAGS",
    "PROP_TARGET_TOPIC",
    # the store
    "AppendResult",
    "FlushMode",
    "GetResult",
    "KeyKind",
    "Message",
    "MessageStore",
    "RecordFlag",
    "RecoveryReport",
    "RetentionHook",
    "RetentionReport",
    "StoreConfig",
    "StoreState",
    "StoredMessage",
    "TopicFence",
]
