"""The wire protocol: frame layout and a sans-IO codec (no asyncio in this package)."""

from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import (
    MAX_BATCH_MESSAGES,
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameKind,
    Opcode,
)

__all__ = [
    "MAX_BATCH_MESSAGES",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "Opcode",
    "encode_frame",
]
