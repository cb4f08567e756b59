"""Frames queued in one turn of the event loop leave together at its end, in one write.

Both ends of a connection use it. On the client, concurrent callers of a service (64 in
`txbroker bench service` on PostgreSQL) queue their requests in the same turn. On the broker,
one group commit wakes all its waiters in one turn, and each answers. A write per frame was a
system call each for the writer and a wake-up each for the reader: on this machine, about as much
CPU as the rest of a request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["TurnWriter"]


class TurnWriter:
    """Queues frames and hands them to ``write`` joined, once per turn of ``loop``. One per
    connection: a frame queued for a connection that is gone must not reach its successor
    (``clear()`` when it drops)."""

    __slots__ = ("_frames", "_loop", "_write")

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[bytes], object]) -> None:
        self._loop = loop
        self._write = write
        self._frames: list[bytes] = []

    def add(self, frame: bytes) -> None:
        self._frames.append(frame)
        if len(self._frames) == 1:
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what is queued now (before a close, say); the scheduled flush then finds
        nothing."""
        frames, self._frames = self._frames, []
        if frames:
            self._write(b"".join(frames))

    def write_now(self, frame: bytes) -> None:
        """Write ``frame`` now, after what is queued and in the same write: for a frame that is
        a whole answer already, which joining could only delay."""
        if self._frames:
            self._frames.append(frame)
            self.flush()
        else:
            self._write(frame)

    def clear(self) -> None:
        self._frames.clear()
