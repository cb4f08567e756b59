"""The checkpoint: how far the store's files are durable and mutually consistent; taking one
(``Checkpointer``); the abnormal-shutdown marker; and ``TailCut``.

A checkpoint at log offset P promises: every commit-log record before P is on disk, and so is
every consume-queue entry for those records; every key-index entry is on disk for the records
before its ``index_offset`` (at most P), so recovery re-queues from P and re-indexes from there.
``queues`` lists each queue's entry count at P, so a queue missing or shorter on disk is
rebuilt. Written with ``write_atomic``: a reader sees the old checkpoint or the new one.

The key index is made durable less often than the queues (``StoreConfig.index_flush_interval_ms``):
its hash slots are rewritten at random places, so every flush of it writes most of the slot
area whatever the traffic, and on the log's disk that burst delays the group commits behind it.
Between its flushes a checkpoint carries the last durable index state forward unchanged.
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
    log_offset: int = 0  # P: everything before it is durable in the log and the queues
    # The key index is durable for the records before this (never past P); -1: at P.
    index_offset: int = -1
    index_base: int = -1  # the active index file at index_offset (-1: none yet)
    index_count: int = 0  # its durable entry count at index_offset
    queues: dict[str, int] = msgspec.field(default_factory=dict)  # "topic/queue" -> count at P
    written_ms: int = 0

    @property
    def index_durable(self) -> int:
        """Where recovery starts re-indexing: the key index holds every record before it."""
        return self.log_offset if self.index_offset < 0 else min(self.index_offset, self.log_offset)


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
    thread, every queue written since the last checkpoint, the key index when its flush is due
    (``index_flush_interval_ms``), then the file."""

    def __init__(
        self,
        data_dir: Path,
        commitlog: CommitLog,
        index: KeyIndex,
        queues: ConsumeQueues,
        flusher: Flusher,
        lifecycle: Lifecycle,
        index_flush_interval_ms: int,
    ) -> None:
        self._dir = data_dir
        self._log = commitlog
        self._index = index
        self._queues = queues
        self._flusher = flusher
        self._lifecycle = lifecycle
        self._index_interval = index_flush_interval_ms / 1000
        # The newest checkpoint whose key-index state is durable, and when the next index
        # flush is due (monotonic seconds); None until the store has written one.
        self._index_durable: Checkpoint | None = None
        self._index_due = 0.0

    def now(self) -> Checkpoint:
        """A checkpoint at the current end of the log, the key index included (not yet durable)."""
        base, count = self._index.state()
        end = self._log.write_pos
        return Checkpoint(
            log_offset=end,
            index_offset=end,
            index_base=base,
            index_count=count,
            queues={queue_key(t, q): cq.max_offset for (t, q), cq in self._queues.by_key.items()},
            written_ms=time.time_ns() // 1_000_000,
        )

    def written(self, cp: Checkpoint) -> None:
        """``cp`` is on disk with everything it covers, the key index included."""
        if self._index_durable is None or cp.index_durable >= self._index_durable.index_durable:
            self._index_durable = cp
            self._index_due = time.monotonic() + self._index_interval

    def make_durable(self, cp: Checkpoint, queues: list[ConsumeQueue], *, index: bool) -> None:
        """In the durable-work thread, once the log is durable up to ``cp.log_offset``:
        ``queues``, the key index if ``index``, then the checkpoint file."""
        for cq in queues:
            cq.sync()
        if index:
            self._index.sync()
        write_checkpoint(self._dir, cp)

    async def checkpoint(self, *, index: bool = False) -> Checkpoint:
        """Make the queues durable up to the current end of the log and record it; the key
        index too when ``index`` or when its flush is due, else record its last durable state."""
        self._lifecycle.check_open()
        committer = self._flusher.committer
        assert committer is not None
        cp = self.now()
        last = self._index_durable
        index = index or last is None or time.monotonic() >= self._index_due
        if not index:
            assert last is not None
            cp = msgspec.structs.replace(
                cp,
                index_offset=last.index_durable,
                index_base=last.index_base,
                index_count=last.index_count,
            )
        dirty, self._queues.dirty = list(self._queues.dirty), set()
        if index and self._index.files:
            self._index.files[-1].write_header()
        await committer.wait_durable()  # the log first: P must be durable before queues
        await committer.run_in_durable_thread(lambda: self.make_durable(cp, dirty, index=index))
        if index:
            self.written(cp)
        return cp
