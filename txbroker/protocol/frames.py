"""The wire frame: byte layout, kinds, opcodes and limits. Written once, here.

Every frame is a 12-byte header (:data:`HEADER`, one comment per field) and a msgspec msgpack
body whose schema depends on (kind, opcode). Big-endian, like most network protocols. Requests
on one connection may be pipelined; answers carry the request's correlation id and may come
back in any order.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

__all__ = [
    "HEADER",
    "MAX_BATCH_MESSAGES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "FrameKind",
    "Opcode",
]

# offset size field        meaning
# 0      4    length u32   bytes after this field: 8 more header bytes + the body
# 4      1    version u8   PROTOCOL_VERSION; anything else is refused
# 5      1    kind u8      FrameKind: request, response, error
# 6      2    opcode u16   Opcode: what the request asks (echoed in its response)
# 8      4    corr_id u32  correlation id chosen by the requester, echoed in the answer
# 12     ...  body         msgspec msgpack; its schema depends on (kind, opcode)
HEADER: Final = struct.Struct(">IBBHI")
LENGTH: Final = struct.Struct(">I")
assert HEADER.size == 12
HEADER_AFTER_LENGTH: Final = HEADER.size - LENGTH.size

PROTOCOL_VERSION: Final = 1

# A frame holds at most one batch: 32 messages of up to 4 MiB would be 128 MiB, far more than
# one request should pin in broker memory, so a batch is bounded by bytes as well as count.
MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
MAX_BATCH_MESSAGES: Final = 1024


class FrameKind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    ERROR = 2


class Opcode(enum.IntEnum):
    """Stable numbers: they are the protocol. Add, never renumber."""

    STREAM = 0  # error frames about the connection itself (garbage, oversize): then it closes
    HELLO = 1  # version + auth token; must be the first request when auth is on
    PING = 2
    TOPIC_CREATE = 10
    TOPIC_DELETE = 11
    TOPIC_LIST = 12
    TOPIC_DESCRIBE = 13
    SEND = 20  # one message
    SEND_BATCH = 21
    PULL = 30  # long poll one or more queues
    ACK = 31  # commit consumer offsets
    NACK = 32  # send a message back for a later retry
    HEARTBEAT = 33  # join / stay in a consumer group, learn the assignment
    LEAVE = 34
    OFFSETS = 35  # group offsets and lag
    LOOKUP = 40  # messages by key, id or idempotency key
    TX_PREPARE = 50
    TX_END = 51
    TX_LIST = 52  # operator: pending and parked transactions
    TX_SHOW = 53
    TX_RESOLVE = 54  # operator: commit, rollback or resume checking
    DLQ_LIST = 60
    DLQ_REDRIVE = 61
    REPL_FETCH = 80  # a slave fetches the master's commit log by offset (replication)
    ROUTE = 70  # NameServer: a topic's route over broker groups, and the groups' masters


KNOWN_OPCODES: Final = frozenset(int(o) for o in Opcode)
