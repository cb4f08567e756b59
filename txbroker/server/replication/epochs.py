"""The master epochs a broker's log went through: where each master's writes begin.

A new master appends ``(epoch, start)``: its election epoch and its log's end when it took
over; slaves copy the master's history with every fetch answer (``meta/epochs.json``). A slave
fetches with its last epoch, and the master answers where that epoch ended in *its* history: a
slave whose log runs past it holds a divergent tail no later master wrote, and cuts it there
(Kafka's leader epoch cache, KIP-101). A broker never elected has an empty history.
"""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import CorruptLog
from txbroker.store.atomicfile import write_atomic

__all__ = ["EPOCHS_FILE", "EpochHistory"]

EPOCHS_FILE: Final = "epochs.json"


class EpochHistory:
    """``[(epoch, start offset), ...]`` in rising epoch order, persisted on every change."""

    def __init__(self, meta_dir: Path) -> None:
        self.path = meta_dir / EPOCHS_FILE
        self.entries: list[tuple[int, int]] = []

    def load(self) -> EpochHistory:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self
        try:
            got = msgspec.json.decode(raw, type=list[tuple[int, int]])
        except msgspec.DecodeError as e:
            raise CorruptLog(f"{self.path}: not an epoch history ({e}); restore it") from e
        self.entries = sorted(got)
        return self

    @property
    def last_epoch(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, start: int) -> None:
        """This broker became master of ``epoch`` with its log ending at ``start``."""
        if self.entries and epoch <= self.entries[-1][0]:
            raise ValueError(f"epoch {epoch} is not after {self.entries[-1][0]}")
        self.entries.append((epoch, start))
        self._save()

    def adopt(self, entries: list[tuple[int, int]]) -> bool:
        """A slave takes its master's history (the master's is the group's); True if it
        changed."""
        got = sorted((int(e), int(s)) for e, s in entries)
        if got == self.entries:
            return False
        self.entries = got
        self._save()
        return True

    def end_of(self, epoch: int) -> int | None:
        """Where the writes of ``epoch`` (or of the last epoch before it this history knows)
        end: the start of the first later epoch, or None if none came after it."""
        i = bisect.bisect_right(self.entries, (epoch, 1 << 62))
        return self.entries[i][1] if i < len(self.entries) else None

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, msgspec.json.encode(self.entries))
