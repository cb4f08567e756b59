"""The checkpoint: how far the store's files are known durable and mutually consistent, plus
the abnormal-shutdown marker.

A checkpoint at log offset P promises: every commit-log record before P is on disk, and so is
every consume-queue and key-index entry for those records. Recovery therefore verifies and
replays the log from P only. ``queues`` lists each consume queue's entry count at P, so a queue
that is missing or shorter on disk (deleted, damaged) is detected and rebuilt from the log.

Written as JSON to a temporary file, fsynced, renamed over the old one, directory fsynced: a
reader sees the old checkpoint or the new one, never a mix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from txbroker.store.atomicfile import write_atomic
from txbroker.store.mapped import fsync_dir

__all__ = ["Checkpoint", "ShutdownMarker", "TailCut", "read_checkpoint", "write_checkpoint"]

CHECKPOINT_FILE: Final = "checkpoint.json"
ABORT_FILE: Final = "abort"
CUT_FILE: Final = "cut"
CHECKPOINT_VERSION: Final = 1


class Checkpoint(msgspec.Struct, frozen=True):
    version: int = CHECKPOINT_VERSION
    log_offset: int = 0  # P: everything before it is durable in log, queues and index
    index_base: int = -1  # the active index file at P (-1: none yet)
    index_count: int = 0  # its durable entry count at P
    queues: dict[str, int] = msgspec.field(default_factory=dict)  # "topic/queue" -> count at P
    written_ms: int = 0


def queue_key(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


def read_checkpoint(data_dir: Path) -> Checkpoint | None:
    path = data_dir / CHECKPOINT_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        cp = msgspec.json.decode(raw, type=Checkpoint)
    except msgspec.DecodeError:
        return None  # unreadable: recover from the start of the log, which is always safe
    return cp if cp.version == CHECKPOINT_VERSION else None


def write_checkpoint(data_dir: Path, cp: Checkpoint) -> None:
    write_atomic(data_dir / CHECKPOINT_FILE, msgspec.json.encode(cp))


class ShutdownMarker:
    """A file that exists while the store is open: found at open, it means the last run did not
    close cleanly (crash, kill -9, power loss) and the full recovery path must run."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / ABORT_FILE

    def was_abnormal(self) -> bool:
        return self.path.exists()

    def set(self) -> None:
        self.path.touch()
        fsync_dir(self.path.parent)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
        fsync_dir(self.path.parent)


class TailCut:
    """Where a failed write cut the log: a small file holding the offset from which nothing was
    acknowledged (every client waiting there was told the append failed). Written when the
    store fails; the next open drops the records from there on, so a restart never delivers a
    record its producer was told failed. Removed once that recovery is durable."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / CUT_FILE

    def read(self) -> int | None:
        try:
            return int(self.path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def write(self, offset: int) -> None:
        write_atomic(self.path, str(offset).encode())

    def clear(self) -> None:
        if self.path.exists():
            self.path.unlink()
            fsync_dir(self.path.parent)
