"""Unique, time-ordered identifiers (UUIDv7 layout, RFC 9562).

Message ids and transaction ids sort by creation time, which keeps index and barrier-table
inserts append-mostly and makes ids readable in logs. Within one millisecond a per-process
counter (seeded randomly) keeps ids strictly increasing from this process.
"""

from __future__ import annotations

import itertools
import os
import time

__all__ = ["id_time_ms", "new_id"]


def _reseed() -> None:
    global _node, _seq
    _node = int.from_bytes(os.urandom(8), "big") & _MASK62
    _seq = itertools.count(int.from_bytes(os.urandom(2), "big"))


_MASK62 = (1 << 62) - 1
_node = 0
_seq = itertools.count()
_reseed()
os.register_at_fork(after_in_child=_reseed)  # a forked child must not repeat its parent's ids
_VERSION_VARIANT = (0x7 << 76) | (0b10 << 62)


def new_id() -> str:
    """Return a 32-character lowercase hex UUIDv7: 48-bit ms time, 74 bits unique per process.

    The random part is a per-process random number plus a counter: unique within the process
    for 2**62 ids (no per-id entropy needed, which keeps this cheap on the append path) and
    unique across processes with the probability of two 62-bit random draws colliding."""
    n = next(_seq)  # atomic under the GIL
    ms = time.time_ns() // 1_000_000
    value = (ms << 80) | _VERSION_VARIANT | ((n & 0xFFF) << 64) | ((_node + n) & _MASK62)
    return f"{value:032x}"


def id_time_ms(identifier: str) -> int:
    """The creation time (ms since the epoch) embedded in an id made by :func:`new_id`."""
    return int(identifier[:12], 16)
