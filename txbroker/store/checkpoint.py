"""The checkpoint: how far the store's files are durable and mutually consistent; taking one
(``Checkpointer``); the abnormal-shutdown marker; and ``TailCut``.

A checkpoint at log offset P promises: every commit-log record before P is on disk, and so is
every consume-queue and key-index entry for those records, so recovery replays from P only.
``queues`` lists each queue's entry count at P, so a queue missing or shorter on disk is
rebuilt. Written with ``write_atomic``: a reader sees the old checkpoint or the new one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Final

import msgspec

from txbroker.store.atomicfile import write_atomic
from txbroker.store.mapped import fsync_dir

if TYPE_CHECKING:
    from txbroker.store.commitlog import CommitLog
    from txbroker.store.consumequeue import ConsumeQueue, ConsumeQueues
    from txbroker.store.flush import Flusher
    from txbroker.store.keyindex import KeyIndex
    from txbroker.store.state import Lifecycle

__all__ = [
    "Checkpoint",
    "Checkpointer",
    "ShutdownMarker",
    "TailCut",
    "read_checkpoint",
    "write_checkpoint",
]

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


class Checkpointer:
    """Takes checkpoints: the log is made durable up to P first, then, in the durable-work
    thread, every queue written since the last checkpoint and the key index, then the file."""

    def __init__(
        self,
        data_dir: Path,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        flusher: Flusher,
        lifecycle: Lifecycle,
    ) -> None:
        self._dir = data_dir
        self._log = commitlog
        self._index = index
        self._queues = queues
        self._flusher = flusher
        self._lifecycle = lifecycle

    def now(self) -> Checkpoint:
        """A checkpoint at the current end of the log (not yet durable)."""
        base, count = self._index.state()
        return Checkpoint(
            log_offset=self._log.write_pos,
            index_base=base,
            index_count=count,
            queues={queue_key(t, q): cq.max_offset for (t, q), cq in self._queues.by_key.items()},
            written_ms=time.time_ns() // 1_000_000,
        )

    def make_durable(self, cp: Checkpoint, queues: list[ConsumeQueue]) -> None:
        """In the durable-work thread, once the log is durable up to ``cp.log_offset``."""
        for cq in queues:
            cq.sync()
        self._index.sync()
        write_checkpoint(self._dir, cp)

    async def checkpoint(self) -> Checkpoint:
        """Make queues and index durable up to the current end of the log and record it."""
        self._lifecycle.check_open()
        committer = self._flusher.committer
        assert committer is not None
        cp = self.now()
        dirty, self._queues.dirty = list(self._queues.dirty), set()
        if self._index.files:
            self._index.files[-1].write_header()
        await committer.wait_durable()  # the log first: P must be durable before queues
        await committer.run_in_durable_thread(lambda: self.make_durable(cp, dirty))
        return cp
