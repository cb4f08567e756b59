"""Frame bodies: one msgspec Struct per request and response, keyed by opcode.

Bodies are msgpack. Field names are short on purpose only where a field travels with every
message; the rest favour clarity. Decoding validates types and required fields, so a handler
never sees a malformed request: :func:`decode_request` raises ``BadRequest`` instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from txbroker.errors import BadRequest
from txbroker.protocol.frames import Opcode

__all__ = [
    "AckRequest",
    "DeletedTopic",
    "ErrorBody",
    "GroupInfo",
    "GroupRoute",
    "GroupsRequest",
    "GroupsResponse",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "Hello",
    "HelloOk",
    "LeaveRequest",
    "PullRequest",
    "PullResponse",
    "PulledMessage",
    "ReplFetchRequest",
    "ReplFetchResponse",
    "QueueLag",
    "QueueOffsets",
    "QueuePosition",
    "RouteRequest",
    "RouteResponse",
    "SendBatchRequest",
    "SendBatchResponse",
    "SendReceipt",
    "SendRequest",
    "TopicCreate",
    "TopicInfo",
    "TopicName",
    "decode_request",
    "decode_response",
    "RESPONSE_DECODERS",
    "encode_body",
]


class Hello(msgspec.Struct, frozen=True):
    client_id: str = ""
    auth_token: str | None = None

    def __repr__(self) -> str:
        # A request may be logged (a failed or posted one is): never with its token.
        token = "<hidden>" if self.auth_token is not None else "None"
        return f"Hello(client_id={self.client_id!r}, auth_token={token})"


class HelloOk(msgspec.Struct, frozen=True):
    server_version: str
    protocol_version: int
    # Whether the server checks auth tokens, so a client that sent one to a broker without
    # tokens can say so; None: the server does not say (a NameServer, an older broker).
    auth_required: bool | None = None


class ErrorBody(msgspec.Struct, frozen=True):
    code: str  # a TxbError code, stable
    message: str
    retriable: bool = False


class TopicCreate(msgspec.Struct, frozen=True):
    topic: str
    queues: int = 4


class TopicName(msgspec.Struct, frozen=True):
    topic: str


class QueueOffsets(msgspec.Struct, frozen=True):
    queue: int
    min_offset: int  # the oldest message still kept
    max_offset: int  # the next message's offset


class TopicInfo(msgspec.Struct, frozen=True):
    topic: str
    queues: int
    messages: int = 0  # sum over queues of (max - min) offsets
    created_ms: int = 0
    offsets: list[QueueOffsets] = msgspec.field(default_factory=list)  # one per queue
    rate_per_s: float | None = None  # messages stored per second, last minute (None: unknown)


class SendRequest(msgspec.Struct, frozen=True):
    topic: str
    body: bytes
    key: str | None = None  # picks the queue (same key, same queue) and is indexed
    tags: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    idempotency_key: str | None = None
    message_id: str | None = None  # producer-assigned; the broker assigns one when absent
    deliver_at_ms: int | None = None  # delayed delivery
    queue_id: int | None = None  # explicit queue, overrides the key's choice


class SendReceipt(msgspec.Struct, frozen=True):
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    duplicate: bool = False  # an idempotency key already stored: this is the original's receipt


class SendBatchRequest(msgspec.Struct, frozen=True):
    messages: list[SendRequest]


class SendBatchResponse(msgspec.Struct, frozen=True):
    receipts: list[SendReceipt]


class QueuePosition(msgspec.Struct, frozen=True):
    queue_id: int
    offset: int


class HeartbeatRequest(msgspec.Struct, frozen=True):
    group: str
    topic: str
    member_id: str
    mode: str = "clustering"  # or "broadcast"
    # Where a group with no committed offset begins: earliest | latest | timestamp.
    start: str = "earliest"
    start_timestamp_ms: int = 0


class HeartbeatResponse(msgspec.Struct, frozen=True):
    generation: int
    queues: list[int]


class LeaveRequest(msgspec.Struct, frozen=True):
    group: str
    topic: str
    member_id: str


class PullRequest(msgspec.Struct, frozen=True):
    group: str
    topic: str
    member_id: str = ""
    generation: int = 0
    max_messages: int = 32
    hold_ms: int = 30_000  # long poll: how long to wait when nothing is there
    tags: list[str] | None = None
    # Where the client wants to read each queue it holds (its own position, which moves only
    # when an answer arrives). Queues not listed start at the group's committed offset.
    positions: list[QueuePosition] = msgspec.field(default_factory=list)


class PulledMessage(msgspec.Struct, frozen=True):
    message_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    key: str | None
    tags: str | None
    headers: dict[str, str]
    born_ms: int
    store_ms: int
    reconsume_count: int = 0


class PullResponse(msgspec.Struct, frozen=True):
    messages: list[PulledMessage]
    # Per queue read: where the next read should start (past messages skipped by a tag filter).
    next_offsets: list[QueuePosition] = msgspec.field(default_factory=list)


class AckRequest(msgspec.Struct, frozen=True):
    group: str
    topic: str
    member_id: str
    generation: int
    positions: list[QueuePosition]  # next offset to consume, per queue


class NackRequest(msgspec.Struct, frozen=True):
    group: str
    topic: str
    member_id: str
    generation: int
    queue_id: int
    queue_offset: int
    # When to deliver it again; None: the group's retry ladder for its reconsume count.
    delay_ms: int | None = None


class NackResponse(msgspec.Struct, frozen=True):
    reconsume_count: int
    dead_lettered: bool  # past the maximum: moved to the group's dead-letter topic
    redeliver_at_ms: int  # 0 when dead-lettered


class DlqRequest(msgspec.Struct, frozen=True):
    group: str
    max_messages: int = 100


class DlqMessage(msgspec.Struct, frozen=True):
    message_id: str
    original_topic: str
    dlq_offset: int
    reconsume_count: int
    body: bytes
    store_ms: int


class DlqListResponse(msgspec.Struct, frozen=True):
    messages: list[DlqMessage]
    redrive_offset: int  # messages before this were already re-driven


class DlqRedriveResponse(msgspec.Struct, frozen=True):
    redriven: int


class TxPrepareRequest(msgspec.Struct, frozen=True):
    topic: str
    body: bytes
    producer_group: str
    check_url: str
    tx_id: str | None = None  # client-chosen (UUIDv7 hex) so it can be recorded first
    key: str | None = None
    tags: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    message_id: str | None = None
    traceparent: str | None = None
    timeout_ms: int | None = None  # first back-check after this long (broker default 6 s)
    deliver_at_ms: int | None = None  # a delayed transactional message


class TxPrepareResponse(msgspec.Struct, frozen=True):
    tx_id: str
    message_id: str


class TxEndRequest(msgspec.Struct, frozen=True):
    tx_id: str
    decision: str  # "commit" | "rollback"


class TxEndResponse(msgspec.Struct, frozen=True):
    tx_id: str
    state: str
    resolved_by: str
    duplicate: bool = False  # the transaction had already ended this way


class TxInfo(msgspec.Struct, frozen=True):
    tx_id: str
    state: str
    topic: str
    queue_id: int
    producer_group: str
    check_url: str
    message_id: str
    key: str | None
    created_ms: int
    checks: int
    next_check_ms: int
    last_reason: str
    resolved_by: str
    # Prepared, and its back-checks have reached no one for the broker's stall time.
    stalled: bool = False
    # When its back-checks stopped reaching the service (epoch ms); None while they reach it.
    unreachable_since_ms: int | None = None
    # Its last write (the PREPARE or the decision) stands in this master's log, but its wait for
    # the slaves timed out and no repeated request has seen them hold it since.
    unconfirmed: bool = False


class TxListRequest(msgspec.Struct, frozen=True):
    state: str | None = None  # prepared | parked | stalled (prepared ones; default: all open)
    topic: str | None = None
    limit: int = 100


class TxListResponse(msgspec.Struct, frozen=True):
    transactions: list[TxInfo]
    total: int


class TxId(msgspec.Struct, frozen=True):
    tx_id: str


class TxResolveRequest(msgspec.Struct, frozen=True):
    tx_id: str
    action: str  # commit | rollback | resume (an operator's decision)


class GroupsRequest(msgspec.Struct, frozen=True):
    """Consumer groups and their lag (OFFSETS), all of them or those of a group or topic."""

    group: str | None = None
    topic: str | None = None


class QueueLag(msgspec.Struct, frozen=True):
    queue: int
    max_offset: int  # the next message's offset
    committed: int | None  # the group's next offset to consume; None: nothing committed yet
    lag: int  # messages not yet committed


class GroupInfo(msgspec.Struct, frozen=True):
    group: str  # group@member for a member of a broadcast group (offsets kept per member)
    topic: str
    members: list[str]  # live members (heartbeating)
    queues: list[QueueLag]
    lag: int  # over all queues
    rate_per_s: float | None = None  # messages committed per second, last minute


class GroupsResponse(msgspec.Struct, frozen=True):
    groups: list[GroupInfo]


class Empty(msgspec.Struct, frozen=True):
    pass


class ReplFetchRequest(msgspec.Struct, frozen=True):
    """A slave asks for the master's commit log from ``from_offset`` (its own end) and reports
    how far its own log is flushed (the master's sync replication waits on that)."""

    replica: str  # the slave's stable name (its data directory's id), one entry per slave
    from_offset: int  # physical offset the answer starts at: the end of the slave's log
    flushed_offset: int  # the slave's log is durable below this offset
    max_bytes: int = 1 << 20  # bound on data (one record larger than this comes whole)
    wait_ms: int = 1_000  # hold the request this long when nothing new is flushed
    last_epoch: int = 0  # the last master epoch in the slave's history (server/epochs.py)
    with_offsets: bool = False  # also send the consumer groups' committed offsets
    # The master's topics version (``ReplFetchResponse.topics_version``) whose topics the slave
    # holds, copied on this connection (0 before its first copy); -1: a slave that does not
    # say (older), which a sync master's topic creation therefore never counts.
    topics_version: int = -1


class DeletedTopic(msgspec.Struct, frozen=True):
    """A deleted topic's fence as a master keeps it (``txbroker.store.fences.TopicFence``):
    its records before log offset ``phys`` are dead; ``ends``: queue id -> the offset a
    queue of that name created again starts at."""

    phys: int
    ends: dict[int, int] = msgspec.field(default_factory=dict)


class ReplFetchResponse(msgspec.Struct, frozen=True):
    """Raw commit-log bytes [offset, offset + len(data)), whole records, all flushed on the
    master. ``next_offset`` is where the next fetch starts: past ``data``, or the next
    segment's start when ``data`` ends the segment (its BLANK filler included)."""

    offset: int
    data: bytes
    next_offset: int
    master_flushed: int  # the master's flushed offset when answering (the slave's lag)
    # The master's epoch history [(epoch, start offset)], which the slave keeps as its own.
    epochs: list[tuple[int, int]] = msgspec.field(default_factory=list)
    # >= 0: the slave's log runs past where its last epoch ended on the master (a divergent
    # tail): it must cut its log at this offset before it fetches again; no data then.
    truncate_to: int = -1
    # With ``with_offsets``: every consumer group's committed offsets, owner -> topic -> queue
    # -> offset, for the slave to keep (a consumer moving to it after a failover resumes).
    offsets: dict[str, dict[str, dict[int, int]]] | None = None
    # The master's log is flushed on enough slaves below this (its consumers read below it): a
    # slave elected later lets its consumers read that far at once, the rest once copied.
    master_covered: int = 0
    # The master's topic registry version (bumped by every creation and deletion): a slave
    # that copied another one copies the topics before it writes ``data``. -1: an older master.
    topics_version: int = -1
    # With a ``topics_version`` other than the one the slave said it holds: the fences of the
    # master's deleted topics (topic -> fence), which the slave deletes and fences alike.
    # None: the slave is up to date, or an older master.
    deleted: dict[str, DeletedTopic] | None = None


class RouteRequest(msgspec.Struct, frozen=True):
    topic: str = ""  # "": no topic, only every group and its master


class GroupRoute(msgspec.Struct, frozen=True):
    group: str
    # The topic's queues this group holds, as global ids in the group's local order: local
    # queue i on the group's brokers is global queue queues[i] (txbroker/cluster/routes.py).
    queues: list[int]
    master: str | None  # txb://host:port of the group's master; None: none registered now
    epoch: int = 0  # the master's election epoch (0: a master by --role master)


class RouteResponse(msgspec.Struct, frozen=True):
    topic: str
    queues: int  # the topic's queues over all groups
    groups: list[GroupRoute]
    revision: int  # the etcd revision the NameServer's view is at


REQUEST_TYPES: Final[dict[int, type[Any]]] = {
    Opcode.HELLO: Hello,
    Opcode.PING: Empty,
    Opcode.TOPIC_CREATE: TopicCreate,
    Opcode.TOPIC_DELETE: TopicName,
    Opcode.TOPIC_LIST: Empty,
    Opcode.TOPIC_DESCRIBE: TopicName,
    Opcode.SEND: SendRequest,
    Opcode.SEND_BATCH: SendBatchRequest,
    Opcode.PULL: PullRequest,
    Opcode.ACK: AckRequest,
    Opcode.HEARTBEAT: HeartbeatRequest,
    Opcode.LEAVE: LeaveRequest,
    Opcode.NACK: NackRequest,
    Opcode.DLQ_LIST: DlqRequest,
    Opcode.DLQ_REDRIVE: DlqRequest,
    Opcode.TX_PREPARE: TxPrepareRequest,
    Opcode.TX_END: TxEndRequest,
    Opcode.TX_LIST: TxListRequest,
    Opcode.TX_SHOW: TxId,
    Opcode.TX_RESOLVE: TxResolveRequest,
    Opcode.OFFSETS: GroupsRequest,
    Opcode.ROUTE: RouteRequest,
    Opcode.REPL_FETCH: ReplFetchRequest,
}

RESPONSE_TYPES: Final[dict[int, type[Any]]] = {
    Opcode.HELLO: HelloOk,
    Opcode.PING: Empty,
    Opcode.TOPIC_CREATE: TopicInfo,
    Opcode.TOPIC_DELETE: Empty,
    Opcode.TOPIC_LIST: list[TopicInfo],
    Opcode.TOPIC_DESCRIBE: TopicInfo,
    Opcode.SEND: SendReceipt,
    Opcode.SEND_BATCH: SendBatchResponse,
    Opcode.PULL: PullResponse,
    Opcode.ACK: Empty,
    Opcode.HEARTBEAT: HeartbeatResponse,
    Opcode.LEAVE: Empty,
    Opcode.NACK: NackResponse,
    Opcode.DLQ_LIST: DlqListResponse,
    Opcode.DLQ_REDRIVE: DlqRedriveResponse,
    Opcode.TX_PREPARE: TxPrepareResponse,
    Opcode.TX_END: TxEndResponse,
    Opcode.TX_LIST: TxListResponse,
    Opcode.TX_SHOW: TxInfo,
    Opcode.TX_RESOLVE: TxEndResponse,
    Opcode.OFFSETS: GroupsResponse,
    Opcode.ROUTE: RouteResponse,
    Opcode.REPL_FETCH: ReplFetchResponse,
}

_encoder = msgspec.msgpack.Encoder()
# What msgspec raises on bytes that are not the type: DecodeError (ValidationError is one), and
# UnicodeDecodeError for a str field that is not UTF-8, which it lets through as it is.
_UNDECODABLE: Final = (msgspec.DecodeError, UnicodeDecodeError)
_decoders: dict[object, msgspec.msgpack.Decoder[Any]] = {}


def _decoder(t: object) -> msgspec.msgpack.Decoder[Any]:
    dec = _decoders.get(t)
    if dec is None:
        dec = _decoders[t] = msgspec.msgpack.Decoder(t)
    return dec


# Encoding a body: the encoder's own method, not a function around it (a Python call less on
# every answer and request).
encode_body: Final[Callable[[object], bytes]] = _encoder.encode
# Each request's and response's decoder, made once: decoding a body is one lookup and one C call.
_REQUEST_DECODERS: Final[dict[int, msgspec.msgpack.Decoder[Any]]] = {
    op: _decoder(t) for op, t in REQUEST_TYPES.items()
}
# Public for the client's compiled answer path (txbroker_sdk/wire.py), which decodes with them
# directly and leaves any failure to decode_response, so both say the same.
RESPONSE_DECODERS: Final[dict[int, msgspec.msgpack.Decoder[Any]]] = {
    op: _decoder(t) for op, t in RESPONSE_TYPES.items()
}


def decode_request(opcode: int, body: bytes) -> Any:
    """The request Struct for ``opcode``; ``BadRequest`` (with the reason) if malformed."""
    dec = _REQUEST_DECODERS.get(opcode)
    if dec is None:
        raise BadRequest(f"opcode {opcode} is not served")
    try:
        return dec.decode(body)
    except _UNDECODABLE as e:
        raise BadRequest(f"malformed {Opcode(opcode).name} request: {e}") from e


def decode_response(opcode: int, body: bytes) -> Any:
    """The response Struct for ``opcode``; ``BadRequest`` (with the reason) if malformed, or if
    the opcode has no response body (STREAM, LOOKUP, a number outside ``Opcode``)."""
    dec = RESPONSE_DECODERS.get(opcode)
    if dec is None:
        raise BadRequest(f"opcode {opcode} has no response body")
    try:
        return dec.decode(body)
    except _UNDECODABLE as e:
        raise BadRequest(f"malformed {Opcode(opcode).name} response: {e}") from e


def decode_error(body: bytes) -> ErrorBody:
    try:
        err: ErrorBody = _decoder(ErrorBody).decode(body)
    except _UNDECODABLE as e:
        return ErrorBody("PROTOCOL_ERROR", f"unreadable error frame: {e}")
    return err
