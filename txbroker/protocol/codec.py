"""Sans-IO frame codec: bytes in, frames out. No sockets, no asyncio, no clocks.

The server and the client each wrap one :class:`FrameDecoder` per connection and feed it what
the transport delivers, in chunks of any size. A malformed stream raises
:class:`~txbroker.errors.ProtocolError` with a stable code (``WrongPort`` for HTTP:
``wrongport.py``); the caller answers with an error frame and closes the connection (the stream
cannot be resynchronised after garbage).
"""

from __future__ import annotations

from typing import Final

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
_HEADER_BYTES: Final = 12  # HEADER.size, as a constant the compiled loop reads without a lookup
_LENGTH_BYTES: Final = 4  # LENGTH.size
assert HEADER.size == _HEADER_BYTES and LENGTH.size == _LENGTH_BYTES


class Frame:
    """One decoded frame. A plain class, not a NamedTuple: compiled, its construction is a C
    call where a NamedTuple's runs Python code for each frame."""

    __slots__ = ("body", "corr_id", "kind", "opcode")

    def __init__(self, kind: int, opcode: int, corr_id: int, body: bytes) -> None:
        self.kind = kind
        self.opcode = opcode
        self.corr_id = corr_id
        self.body = body

    def __repr__(self) -> str:
        return (
            f"Frame(kind={self.kind}, opcode={self.opcode}, corr_id={self.corr_id}, "
            f"body={self.body!r})"
        )


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
        # One copy of what arrived (with any partial frame kept from before) as bytes, so
        # each frame's body is one slice of it: a slice of a bytearray would be copied twice.
        if self._buf:
            self._buf += data
            src = bytes(self._buf)
        else:
            src = data if type(data) is bytes else bytes(data)
        frames: list[Frame] = []
        pos = 0
        n = len(src)
        unpack = HEADER.unpack_from  # looked up once per call, not once per frame
        try:
            while n - pos >= _HEADER_BYTES:
                length, version, kind, opcode, corr = unpack(src, pos)
                self._check(length, version, kind, opcode)
                end = pos + _LENGTH_BYTES + length
                if end > n:
                    break
                frames.append(Frame(kind, opcode, corr, src[pos + _HEADER_BYTES : end]))
                pos = end
            if n - pos >= LENGTH.size:
                # Refuse an oversized length as soon as it is visible, not after buffering it.
                (length,) = LENGTH.unpack_from(src, pos)
                if length > self._max:
                    raise FrameTooLarge(f"frame length {length} exceeds the {self._max} limit")
        except ProtocolError as e:
            self.broken = True
            # HTTP's letters, read as a length, are over the limit: say it is HTTP instead.
            http = http_met(src[pos : pos + SEEN_BYTES_MAX]) if type(e) is FrameTooLarge else None
            self._buf.clear()
            if http is not None:
                raise http from None
            raise
        if pos < n:
            self._buf = bytearray(src[pos:])
        elif self._buf:
            self._buf.clear()
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
