"""Sans-IO frame codec: bytes in, frames out. No sockets, no asyncio, no clocks.

The server and the client each wrap one :class:`FrameDecoder` per connection and feed it what
the transport delivers, in chunks of any size. A malformed stream raises
:class:`~txbroker.errors.ProtocolError` with a stable code (``WrongPort`` for HTTP:
``wrongport.py``); the caller answers with an error frame and closes the connection (the stream
cannot be resynchronised after garbage).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from txbroker.errors import FrameTooLarge, ProtocolError
from txbroker.protocol.frames import (
    HEADER,
    HEADER_AFTER_LENGTH,
    KNOWN_OPCODES,
    LENGTH,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameKind,
)
from txbroker.protocol.wrongport import SEEN_BYTES_MAX, http_met

__all__ = ["Frame", "FrameDecoder", "encode_frame"]

_KINDS: Final = frozenset(int(k) for k in FrameKind)


class Frame(NamedTuple):
    kind: int
    opcode: int
    corr_id: int
    body: bytes


def encode_frame(kind: int, opcode: int, corr_id: int, body: bytes) -> bytes:
    length = HEADER_AFTER_LENGTH + len(body)
    if length > MAX_FRAME_BYTES:
        raise FrameTooLarge(f"frame of {length} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return HEADER.pack(length, PROTOCOL_VERSION, kind, opcode, corr_id & 0xFFFFFFFF) + body


class FrameDecoder:
    """Accumulates bytes and yields whole frames. One instance per connection direction."""

    __slots__ = ("_buf", "_max", "_need_known_opcode", "broken")

    def __init__(self, *, max_frame_bytes: int = MAX_FRAME_BYTES, known_opcodes: bool = True):
        self._buf = bytearray()
        self._max = max_frame_bytes
        self._need_known_opcode = known_opcodes
        self.broken = False  # after an error the stream is unusable

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add bytes; return every frame now complete, in order. Raises ProtocolError on a
        malformed header (frames decoded before it in the same call are lost with the
        connection, which the caller closes)."""
        if self.broken:
            raise ProtocolError("the stream already failed; close the connection")
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        n = len(buf)
        try:
            while n - pos >= HEADER.size:
                length, version, kind, opcode, corr = HEADER.unpack_from(buf, pos)
                self._check(length, version, kind, opcode)
                end = pos + LENGTH.size + length
                if end > n:
                    break
                frames.append(Frame(kind, opcode, corr, bytes(buf[pos + HEADER.size : end])))
                pos = end
            if n - pos >= LENGTH.size:
                # Refuse an oversized length as soon as it is visible, not after buffering it.
                (length,) = LENGTH.unpack_from(buf, pos)
                if length > self._max:
                    raise FrameTooLarge(f"frame length {length} exceeds the {self._max} limit")
        except ProtocolError as e:
            self.broken = True
            # HTTP's letters, read as a length, are over the limit: say it is HTTP instead.
            http = http_met(buf[pos : pos + SEEN_BYTES_MAX]) if type(e) is FrameTooLarge else None
            buf.clear()
            if http is not None:
                raise http from None
            raise
        del buf[:pos]
        return frames

    def _check(self, length: int, version: int, kind: int, opcode: int) -> None:
        if length > self._max:
            raise FrameTooLarge(f"frame length {length} exceeds the {self._max} limit")
        if length < HEADER_AFTER_LENGTH:
            raise ProtocolError(f"frame length {length} is shorter than a header")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"unsupported protocol version {version} (speak {PROTOCOL_VERSION})"
            )
        if kind not in _KINDS:
            raise ProtocolError(f"unknown frame kind {kind}")
        if self._need_known_opcode and opcode not in KNOWN_OPCODES:
            raise ProtocolError(f"unknown opcode {opcode}")

    @property
    def buffered(self) -> int:
        return len(self._buf)
