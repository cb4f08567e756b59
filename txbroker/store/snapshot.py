"""A small state file rewritten atomically when its owner's state has changed.

The owner marks it dirty on each change. Once a second the broker takes the snapshot on the
event loop (``take``: encodes the state there, so no other thread ever iterates a dict the loop
is changing) and writes it in a worker thread (``write``). A failed write makes the snapshot
due again, so nothing is silently skipped. Saves are serialised: two writers (the broker's
housekeeping and a transaction layer saving after it moved half messages) never share the
temporary file, and the later state is always the one written last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from txbroker.store.atomicfile import write_atomic

__all__ = ["Snapshot"]


class Snapshot:
    def __init__(self, path: Path, encode: Callable[[], bytes]) -> None:
        self.path = path
        self._encode = encode
        self.dirty = False
        self._saving = asyncio.Lock()

    def mark(self) -> None:
        self.dirty = True

    def take(self) -> bytes | None:
        """On the event loop: the bytes to write, or None when nothing changed."""
        if not self.dirty:
            return None
        self.dirty = False
        return self._encode()

    def write(self, data: bytes) -> None:
        """In a worker thread (or at start-up)."""
        try:
            write_atomic(self.path, data)
        except BaseException:
            self.dirty = True
            raise

    def save(self) -> None:
        data = self.take()
        if data is not None:
            self.write(data)

    async def save_async(self) -> None:
        async with self._saving:
            data = self.take()
            if data is not None:
                await asyncio.to_thread(self.write, data)
