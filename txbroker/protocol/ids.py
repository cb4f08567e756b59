"""Unique, time-ordered identifiers (UUIDv7 layout, RFC 9562).

Message ids and transaction ids sort by creation time, which keeps index and barrier-table
inserts append-mostly and makes ids readable in logs. Within one millisecond a per-process
counter (seeded randomly) keeps ids strictly increasing from this process.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from typing import Final

__all__ = ["ID_CHARS", "id_time_ms", "new_id"]

_MASK62: Final = (1 << 62) - 1
# The id's 128 bits, big-endian, packed from numbers that each fit a machine word (so the
# compiled build does no arithmetic on Python's arbitrary-size ints, and one pack and one
# hex() replace formatting a 128-bit int):
_ID: Final = struct.Struct(
    ">"
    "Q"  # 48-bit ms time, version 7 (4 bits), the counter's low 12 bits
    "I"  # variant 0b10, then the high 30 of the 62 unique bits
    "I"  # the low 32 unique bits
)
assert _ID.size == 16
ID_CHARS: Final = 2 * _ID.size  # the length of an id from new_id(): hex, two digits a byte
# Bound once: compiled, a Final is a constant, where ``_ID.pack`` and ``time.time_ns`` are
# attribute lookups at every call.
_pack_id: Final = _ID.pack
_time_ns: Final = time.time_ns


class _Source:
    """Where ids come from in this process: a random node number and a counter."""

    def __init__(self) -> None:
        self.node = 0
        self.seq = itertools.count()
        self.reseed()

    def reseed(self) -> None:
        self.node = int.from_bytes(os.urandom(8), "big") & _MASK62
        self.seq = itertools.count(int.from_bytes(os.urandom(2), "big"))


_SOURCE: Final = _Source()
os.register_at_fork(
    after_in_child=_SOURCE.reseed
)  # a forked child must not repeat its parent's ids


def new_id() -> str:
    """Return a 32-character lowercase hex UUIDv7: 48-bit ms time, 74 bits unique per process.

    The random part is a per-process random number plus a counter: unique within the process
    for 2**62 ids (no per-id entropy needed, which keeps this cheap on the append path) and
    unique across processes with the probability of two 62-bit random draws colliding."""
    src = _SOURCE
    n: int = next(src.seq)  # atomic under the GIL
    ms = _time_ns() // 1_000_000
    unique = (src.node + n) & _MASK62
    high = (ms << 16) | 0x7000 | (n & 0xFFF)
    return _pack_id(high, 0x8000_0000 | (unique >> 32), unique & 0xFFFF_FFFF).hex()


def id_time_ms(identifier: str) -> int:
    """The creation time (ms since the epoch) embedded in an id made by :func:`new_id`."""
    return int(identifier[:12], 16)
