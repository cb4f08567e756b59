"""The commit-log record: its byte layout, limits, encoder and decoder. Written once, here.

A record is a fixed 56-byte header (``HEADER``, one comment per field) followed by the topic,
the properties and the body. ``total_size == 56 + topic_len + props_len + body_len`` always,
a second check beside the CRC. A record never spans segments: when the next one does not fit,
a BLANK record (size + magic only, no CRC) fills the segment's remainder; a remainder smaller
than a header is the end of the segment too. All integers are little-endian.
"""

from __future__ import annotations

import enum
import mmap
import struct
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import google_crc32c
import msgspec

from txbroker.errors import CorruptLog, InvalidArgument, MessageTooLarge

__all__ = [
    "HEADER",
    "MAGIC_BLANK",
    "MAGIC_MESSAGE",
    "MAX_BODY_BYTES",
    "MAX_PROPERTIES_BYTES",
    "MAX_RECORD_BYTES",
    "PROP_IDEMPOTENCY_KEY",
    "PROP_INTERNAL_KEY",
    "PROP_KEYS",
    "PROP_MESSAGE_ID",
    "PROP_ORIGINAL_TOPIC",
    "PROP_TAGS",
    "PROP_TARGET_TOPIC",
    "Message",
    "RecordFlag",
    "StoredMessage",
    "decode_properties",
    "decode_record",
    "encode_properties",
    "encode_record_parts",
]

Buffer: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

# --- layout ---------------------------------------------------------------------------------

# Split in two so the CRC can be computed over META before PREFIX (which holds the CRC) is packed.
_PREFIX_FORMAT: Final = (
    "<"
    "I"  # 0   total_size: whole record in bytes, header included
    "I"  # 4   magic: MAGIC_MESSAGE, or MAGIC_BLANK for end-of-segment filler
    "I"  # 8   crc: CRC32C (Castagnoli) of bytes [12, total_size)
)
_META_FORMAT: Final = (
    "H"  # 12  flags: RecordFlag bits (kind of record: normal, half, tx op, ...)
    "H"  # 14  queue_id: queue within the topic
    "Q"  # 16  queue_off: position of this record in its consume queue
    "Q"  # 24  phys_off: position of this record in the commit log (self-check)
    "Q"  # 32  born_ms: producer's clock when the message was created
    "Q"  # 40  store_ms: broker's clock when the record was appended
    "I"  # 48  body_len: length of the body
    "H"  # 52  props_len: length of the msgpack-encoded property map (0 = empty)
    "H"  # 54  topic_len: length of the UTF-8 topic name; topic, properties, body follow
)
PREFIX: Final = struct.Struct(_PREFIX_FORMAT)
META: Final = struct.Struct("<" + _META_FORMAT)
HEADER: Final = struct.Struct(_PREFIX_FORMAT + _META_FORMAT)
SIZE_MAGIC: Final = struct.Struct("<II")  # enough to classify a position: size + magic
CRC_START: Final = 12  # the CRC covers [CRC_START, total_size)

assert HEADER.size == 56
assert PREFIX.size + META.size == HEADER.size
assert PREFIX.size == CRC_START

MAGIC_MESSAGE: Final = 0x31425854  # b"TXB1" read little-endian
MAGIC_BLANK: Final = 0x30425854  # b"TXB0"

# --- limits ---------------------------------------------------------------------------------

# 4 MiB, RocketMQ's default maxMessageSize: large enough for any event, small enough that one
# message cannot monopolise a group commit or a consumer's pull batch.
MAX_BODY_BYTES: Final = 4 * 1024 * 1024
# Properties carry keys, ids and trace context, not payload; 32 KiB also fits props_len's u16.
MAX_PROPERTIES_BYTES: Final = 32 * 1024 - 1
MAX_TOPIC_BYTES: Final = 127
MAX_QUEUE_ID: Final = 0xFFFF
MAX_RECORD_BYTES: Final = HEADER.size + MAX_TOPIC_BYTES + MAX_PROPERTIES_BYTES + MAX_BODY_BYTES

assert MAX_PROPERTIES_BYTES <= 0xFFFF

# --- properties -----------------------------------------------------------------------------

# Property names are short because they are stored in every record.
PROP_MESSAGE_ID: Final = "id"  # unique message id (UUIDv7 hex), assigned by the producer
PROP_KEYS: Final = "keys"  # business keys, space-separated; each is indexed
PROP_TAGS: Final = "tags"  # one tag, used for server-side filtering via the tag hash
PROP_IDEMPOTENCY_KEY: Final = "ik"  # producer's idempotency key, indexed for deduplication
PROP_INTERNAL_KEY: Final = "ix"  # broker-internal dedup key (e.g. a scheduler hop), indexed
# A copy of a message in a broker-internal topic names the user topic it belongs to (so the
# copies die with that topic: see fences.py).
PROP_ORIGINAL_TOPIC: Final = "ot"  # retry and dead-letter copies: the topic consumed from
PROP_TARGET_TOPIC: Final = "tt"  # half messages and delayed copies: the topic delivered to

KEY_SEPARATOR: Final = " "


class RecordFlag(enum.IntFlag):
    """What kind of record this is. Transactions use the TX bits."""

    NONE = 0
    TX_HALF = 1  # a prepared (half) message, stored in the internal half topic
    TX_OP = 2  # an op record resolving a half message
    TX_COMMITTED = 4  # the visible copy of a committed transactional message
    DELAYED = 8  # held in the schedule topic until its delivery time


_props_encoder = msgspec.msgpack.Encoder()
_props_decoder = msgspec.msgpack.Decoder(dict[str, str])
_encode_props: Final = _props_encoder.encode


def encode_properties(properties: Mapping[str, str]) -> bytes:
    if not properties:
        return b""
    given: Any = properties  # untyped: a wrong type must reach the check (mypyc checks first)
    for k, v in given.items():
        if type(k) is not str or type(v) is not str:
            raise InvalidArgument(f"properties must map str to str, got {k!r}: {v!r}")
    data = _encode_props(properties)
    if len(data) > MAX_PROPERTIES_BYTES:
        raise MessageTooLarge(
            f"properties take {len(data)} bytes encoded; the limit is {MAX_PROPERTIES_BYTES}"
        )
    return data


def decode_properties(data: Buffer) -> dict[str, str]:
    """The property map of a record (``props_len`` bytes after the topic); empty bytes are {}."""
    return _props_decoder.decode(data) if len(data) else {}


# --- domain records -------------------------------------------------------------------------


class Message(msgspec.Struct, frozen=True, gc=False):
    """A message to append. The store assigns queue offset, physical offset and store time."""

    topic: str
    body: bytes
    queue_id: int = 0
    # msgspec copies an empty mutable default for each instance. Not msgspec.field(): compiled
    # by mypyc, a class attribute must have its annotated type.
    properties: dict[str, str] = {}
    flags: int = 0
    born_timestamp_ms: int = 0


class StoredMessage(msgspec.Struct, frozen=True, gc=False):
    """A record read back from the commit log."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    flags: int
    born_timestamp_ms: int
    store_timestamp_ms: int
    properties: dict[str, str]
    body: bytes

    @property
    def message_id(self) -> str | None:
        return self.properties.get(PROP_MESSAGE_ID)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROP_KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROP_TAGS)

    @property
    def idempotency_key(self) -> str | None:
        return self.properties.get(PROP_IDEMPOTENCY_KEY)


# --- codec ----------------------------------------------------------------------------------


def encode_record_parts(
    topic_bytes: bytes,
    props: bytes,
    body: bytes,
    flags: int,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    born_ms: int,
    store_ms: int,
) -> tuple[bytes, bytes]:
    """One record in two parts (positional arguments: this is the append hot path):
    ``PREFIX`` (size, magic, CRC) and the bytes the CRC covers, so the CRC is one call over one
    buffer and a writer that appends to a buffer of its own copies the body no more often than
    with one part. Limits are the caller's to check
    before assigning offsets; breaking them here is a bug, hence asserts."""
    body_len = len(body)
    props_len = len(props)
    topic_len = len(topic_bytes)
    assert body_len <= MAX_BODY_BYTES and props_len <= MAX_PROPERTIES_BYTES
    assert topic_len <= MAX_TOPIC_BYTES and 0 <= queue_id <= MAX_QUEUE_ID
    meta = _pack_meta(
        flags,
        queue_id,
        queue_offset,
        physical_offset,
        born_ms,
        store_ms,
        body_len,
        props_len,
        topic_len,
    )
    rest = b"".join((meta, topic_bytes, props, body))
    total = CRC_START + len(rest)  # PREFIX is the bytes before CRC_START
    return _pack_prefix(total, MAGIC_MESSAGE, _crc_value(rest)), rest


_pack_meta: Final = META.pack
_pack_prefix: Final = PREFIX.pack
_crc_value: Final = google_crc32c.value


def decode_record(buf: Buffer, pos: int = 0) -> StoredMessage:
    """Decode and verify the record at ``buf[pos:]``; raise :class:`CorruptLog` on any mismatch."""
    reason = check_record(buf, pos)
    if reason is not None:
        raise CorruptLog(f"record at buffer position {pos}: {reason}")
    (total, _magic, _crc, flags, qid, qoff, phys, born, store, body_len, props_len, topic_len) = (
        HEADER.unpack_from(buf, pos)
    )
    p = pos + HEADER.size
    topic = bytes(buf[p : p + topic_len]).decode()
    p += topic_len
    props = _props_decoder.decode(buf[p : p + props_len]) if props_len else {}
    p += props_len
    body = bytes(buf[p : p + body_len])
    return StoredMessage(
        topic=topic,
        queue_id=qid,
        queue_offset=qoff,
        physical_offset=phys,
        size=total,
        flags=flags,
        born_timestamp_ms=born,
        store_timestamp_ms=store,
        properties=props,
        body=body,
    )


def check_record(buf: Buffer, pos: int = 0) -> str | None:
    """Return None when a whole, valid message record starts at ``pos``, else why not."""
    avail = len(buf) - pos
    if avail < HEADER.size:
        return f"only {avail} bytes left, a header needs {HEADER.size}"
    total, magic, crc, *_, body_len, props_len, topic_len = HEADER.unpack_from(buf, pos)
    if magic != MAGIC_MESSAGE:
        return f"bad magic 0x{magic:08x}"
    if total != HEADER.size + topic_len + props_len + body_len:
        return f"size {total} disagrees with its parts"
    if total > avail:
        return f"size {total} runs past the end ({avail} bytes left)"
    if body_len > MAX_BODY_BYTES or props_len > MAX_PROPERTIES_BYTES:
        return "a length is over its limit"
    actual: int = google_crc32c.value(bytes(buf[pos + CRC_START : pos + total]))
    if actual != crc:
        return f"CRC mismatch (stored 0x{crc:08x}, computed 0x{actual:08x})"
    return None
