"""Consume queues: per (topic, queue) index of the commit log, one fixed 20-byte entry a message.

Entry N of a queue is message N of that queue (its queue offset), so a consumer's position is a
plain integer and a read is one multiplication. Files live in
``<data>/consumequeue/<topic>/<queue_id>/``, named by their first queue offset (20 digits),
each a fixed number of entries; a zero ``size`` marks an entry never written. Consume queues
are derived data: recovery rebuilds them from the commit log. ``ConsumeQueues``: all of them.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import logging
import shutil
import struct
from collections.abc import Collection
from pathlib import Path
from typing import Final

from txbroker.errors import CorruptLog
from txbroker.store.fences import Fences
from txbroker.store.mapped import MappedFile, remove_temporaries

__all__ = ["CQ_ENTRY", "ConsumeQueue", "ConsumeQueues", "tag_hash"]

log = logging.getLogger(__name__)

# One consume-queue entry, little-endian.
CQ_ENTRY: Final = struct.Struct(
    "<"
    "Q"  # phys_offset: where the record starts in the commit log
    "I"  # size: record size in bytes (never 0 in a written entry)
    "Q"  # tag_hash: 64-bit hash of the record's tag, 0 when it has none
)
assert CQ_ENTRY.size == 20
_ENTRY_BYTES: Final = 20  # CQ_ENTRY.size, as a constant for the append path
_pack_entry: Final = CQ_ENTRY.pack_into

NAME_DIGITS: Final = 20


@functools.lru_cache(maxsize=4096)
def tag_hash(tag: str | None) -> int:
    """Stable 64-bit tag hash (0 for no tag). Stable across processes, unlike ``hash()``."""
    if not tag:
        return 0
    h = int.from_bytes(hashlib.blake2b(tag.encode(), digest_size=8).digest(), "little")
    return h or 1


class ConsumeQueue:
    __slots__ = (
        "_bases",
        "_synced",
        "dir",
        "files",
        "max_offset",
        "min_offset",
        "per_file",
        "queue_id",
        "topic",
    )

    def __init__(
        self, root: Path, topic: str, queue_id: int, per_file: int, start: int = 0
    ) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.dir = root / topic / str(queue_id)
        self.per_file = per_file
        self.files: list[MappedFile] = []
        self._bases: list[int] = []
        # A queue of a re-created topic starts where the deleted one ended (see fences.py).
        self.min_offset = start  # first queue offset still readable
        self.max_offset = start  # next queue offset to be written
        self._synced = start  # entries before this are known durable

    def load(self) -> None:
        """Open the queue's files. Raises CorruptLog if they do not tile the offset space
        (a file was deleted): recovery then rebuilds the queue from the commit log."""
        if not self.dir.exists():
            return
        remove_temporaries(self.dir)
        for p in sorted(self.dir.iterdir()):
            if p.name.isdigit() and len(p.name) == NAME_DIGITS:
                f = MappedFile.open(p, int(p.name))
                self.files.append(f)
                self._bases.append(f.base)
        if not self.files:
            return
        for a, b in zip(self.files, self.files[1:], strict=False):
            if a.base + a.size // CQ_ENTRY.size != b.base:
                raise CorruptLog(f"consume queue {self.dir} is missing entries {a.base}..{b.base}")
        self.min_offset = self.files[0].base
        self.max_offset = self._find_end()
        self._synced = self.max_offset

    def _find_end(self, hint: int | None = None) -> int:
        """First unwritten entry of the last file holding any. Entries are written in order, so
        the written ones form a prefix: start at the checkpoint's count when known, else binary
        search."""
        # Trailing files can be wholly unwritten: when recovery's truncate_from_phys removes
        # entries back across a file boundary, clear_after_end zeroes the newer file but keeps
        # it. Taking that file's base as the end would turn the removed entries before it into
        # holes, and the next append would take the file's base as its queue offset. (A file
        # created just before a crash is empty too; the file before it is then full, so stepping
        # back finds the same end.)
        k = len(self.files) - 1
        while k > 0 and not CQ_ENTRY.unpack_from(self.files[k].mm, 0)[1]:
            k -= 1
        last = self.files[k]
        n = last.size // CQ_ENTRY.size
        mm = last.mm

        def written(i: int) -> bool:
            return bool(CQ_ENTRY.unpack_from(mm, i * CQ_ENTRY.size)[1])

        if hint is not None and last.base <= hint <= last.base + n:
            i = hint - last.base
            # The entry before the hint must be written, else the file is shorter than the
            # checkpoint says: fall through to the search, and recovery will rebuild.
            if i == 0 or written(i - 1):
                while i < n and written(i):
                    i += 1
                return last.base + i
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) // 2
            if written(mid):
                lo = mid + 1
            else:
                hi = mid
        return last.base + lo

    def reload_end(self, hint: int) -> None:
        if self.files:
            self.max_offset = self._find_end(hint)

    def _file_for(self, qoff: int) -> MappedFile:
        i = bisect.bisect_right(self._bases, qoff) - 1
        if i >= 0:
            f = self.files[i]
            if qoff < f.base + f.size // CQ_ENTRY.size:
                return f
        # Files tile the offset space from the first one, which starts at the first entry the
        # queue holds (0, or where a deleted topic's queue ended, or the first record a rebuild
        # after retention finds), so a queue never begins with a run of unwritten entries.
        if not self.files:
            base = qoff
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            last = self.files[-1]
            edge = last.base + last.size // CQ_ENTRY.size if qoff >= last.base else self._bases[0]
            base = edge + (qoff - edge) // self.per_file * self.per_file
        f = MappedFile.create(
            self.dir / f"{base:0{NAME_DIGITS}d}", base, self.per_file * CQ_ENTRY.size
        )
        i = bisect.bisect_left(self._bases, base)
        self.files.insert(i, f)
        self._bases.insert(i, base)
        if len(self.files) == 1:
            self.min_offset = base
        return f

    def reserve(self, count: int) -> None:
        """Create the files the next ``count`` entries go to, so writing them cannot fail for
        want of space or permission: an append allocates everything before it writes anything.
        Raises StoreFailed (nothing written) when a file cannot be created."""
        qoff, end = self.max_offset, self.max_offset + count
        if self.files:
            last = self.files[-1]
            if last.base <= qoff and end <= last.base + last.size // _ENTRY_BYTES:
                return  # the common case: room in the active file
        while qoff < end:
            f = self._file_for(qoff)
            qoff = f.base + f.size // CQ_ENTRY.size

    def put(self, qoff: int, phys: int, size: int, taghash: int) -> None:
        """Write entry ``qoff``. In normal appends qoff == max_offset; recovery replays may
        rewrite entries (idempotent: same record, same bytes)."""
        f = self.files[-1] if self.files else None
        if f is None or not (f.base <= qoff < f.base + self.per_file):
            f = self._file_for(qoff)
        _pack_entry(f.mm, (qoff - f.base) * _ENTRY_BYTES, phys, size, taghash)
        if qoff >= self.max_offset:
            self.max_offset = qoff + 1

    def _file_for_read(self, qoff: int) -> MappedFile | None:
        i = bisect.bisect_right(self._bases, qoff) - 1
        return self.files[i] if i >= 0 else None

    def read(
        self, qoff: int, max_count: int, tags: Collection[int] | None = None
    ) -> tuple[list[tuple[int, int, int, int]], int]:
        """Entries from ``qoff`` on: ([(queue_offset, phys, size, tag_hash)], next_offset).

        With ``tags``, entries whose tag hash is not in it are skipped (and counted as read, so
        ``next_offset`` moves past them): the server-side tag filter."""
        out: list[tuple[int, int, int, int]] = []
        qoff = max(qoff, self.min_offset)
        scanned = 0
        # Filtered reads skip entries; bound how many we look at so one pull stays cheap.
        scan_limit = max_count if tags is None else max_count * 64
        while qoff < self.max_offset and len(out) < max_count and scanned < scan_limit:
            f = self._file_for_read(qoff)
            if f is None:
                break
            rel = qoff - f.base
            n = min(self.max_offset - qoff, f.size // CQ_ENTRY.size - rel, scan_limit - scanned)
            start = rel * CQ_ENTRY.size
            for i, (phys, size, th) in enumerate(
                CQ_ENTRY.iter_unpack(f.mm[start : start + n * CQ_ENTRY.size])
            ):
                scanned += 1
                if size == 0:
                    continue  # never written (a hole recovery could not fill); skip it
                if tags is None or th in tags:
                    out.append((qoff + i, phys, size, th))
                    if len(out) >= max_count:
                        return out, qoff + i + 1
            qoff += n
        return out, qoff

    def truncate_from_phys(self, log_end: int) -> int:
        """Remove tail entries that point at or past ``log_end``; return how many."""
        removed = 0
        while self.max_offset > self.min_offset:
            q = self.max_offset - 1
            f = self._file_for_read(q)
            assert f is not None
            pos = (q - f.base) * CQ_ENTRY.size
            phys, size, _ = CQ_ENTRY.unpack_from(f.mm, pos)
            if size and phys < log_end:
                break
            f.mm[pos : pos + CQ_ENTRY.size] = bytes(CQ_ENTRY.size)
            self.max_offset = q
            removed += 1
        return removed

    def clear_after_end(self) -> None:
        """Zero stale entries past ``max_offset`` (left by a crash that lost the records they
        pointed at) so no later scan can take them for written ones."""
        for f in self.files:
            if f.base + f.size // CQ_ENTRY.size <= self.max_offset:
                continue
            start = max(self.max_offset - f.base, 0) * CQ_ENTRY.size
            tail = f.mm[start:]
            if tail.count(0) != len(tail):
                f.mm[start:] = bytes(len(tail))

    def drop_before_phys(self, log_min: int) -> list[MappedFile]:
        """Retention: detach files wholly before ``log_min`` and advance ``min_offset`` to the
        first entry still in the log. Returns the detached files for the caller to unlink."""
        dead: list[MappedFile] = []
        while len(self.files) > 1:
            f = self.files[0]
            last = self.files[1].base - 1
            phys, _size, _ = CQ_ENTRY.unpack_from(f.mm, (last - f.base) * CQ_ENTRY.size)
            if phys >= log_min:
                break
            dead.append(self.files.pop(0))
            self._bases.pop(0)
        if self.files:
            self.min_offset = max(self.min_offset, self.files[0].base)
            # Binary search the first entry whose record survives.
            lo, hi = self.min_offset, self.max_offset
            while lo < hi:
                mid = (lo + hi) // 2
                e = self.entry_raw(mid)
                if e is not None and e[1] and e[0] >= log_min:
                    hi = mid
                else:
                    lo = mid + 1
            self.min_offset = lo
        return dead

    def first_at_or_after(self, phys: int) -> int:
        """The first queue offset whose record lies at or after ``phys`` (``max_offset`` if
        none): a queue's entries point into the log in increasing order."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.entry_raw(mid)
            if e is not None and e[1] and e[0] >= phys:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def entry_raw(self, qoff: int) -> tuple[int, int, int] | None:
        f = self._file_for_read(qoff)
        if f is None or qoff >= f.base + f.size // CQ_ENTRY.size:
            return None
        e: tuple[int, int, int] = CQ_ENTRY.unpack_from(f.mm, (qoff - f.base) * CQ_ENTRY.size)
        return e

    def sync(self, *, everything: bool = False) -> None:
        """fdatasync every file written since the last sync (all files with ``everything``,
        after a rebuild). Runs in the durable-work thread; ``upto`` is read once, first."""
        upto = self.max_offset
        for f in list(self.files):
            if everything or f.base + f.size // CQ_ENTRY.size > self._synced:
                f.sync()
        self._synced = upto

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files.clear()
        self._bases.clear()


class ConsumeQueues:
    """Every consume queue of a store by (topic, queue id), and which were written since the
    last checkpoint (``dirty``: the checkpoint syncs those)."""

    def __init__(self, root: Path, per_file: int, fences: Fences) -> None:
        self.root = root
        self.per_file = per_file
        self._fences = fences
        self.by_key: dict[tuple[str, int], ConsumeQueue] = {}
        self.dirty: set[ConsumeQueue] = set()

    def new(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A queue not yet known; it joins when its first entry is written. A deleted
        topic's queue starts where the deleted one ended (see ``fences.py``)."""
        start = self._fences.start(topic, queue_id)
        return ConsumeQueue(self.root, topic, queue_id, self.per_file, start)

    def load(self) -> None:
        """Open every queue on disk. A queue whose files do not tile is dropped: derived
        data, rebuilt by recovery (the checkpoint lists it)."""
        if not self.root.exists():
            return
        for tdir in sorted(self.root.iterdir()):
            if not tdir.is_dir():
                continue
            for qdir in sorted(tdir.iterdir()):
                if qdir.is_dir() and qdir.name.isdigit():
                    cq = ConsumeQueue(self.root, tdir.name, int(qdir.name), self.per_file)
                    try:
                        cq.load()
                    except CorruptLog as e:
                        log.warning("%s; rebuilding it from the commit log", e)
                        cq.close()
                        shutil.rmtree(qdir)
                        continue
                    self.by_key[(tdir.name, int(qdir.name))] = cq

    def drop_topic(self, topic: str) -> int:
        """Forget ``topic``'s queues and remove their files; return the bytes freed."""
        dropped = [self.by_key.pop(k) for k in [k for k in self.by_key if k[0] == topic]]
        freed = sum(f.size for cq in dropped for f in cq.files)
        for cq in dropped:
            self.dirty.discard(cq)
            cq.close()  # readers in worker threads hold their own references
        # Queue files are derived data: if removing them fails, the next open drops them.
        shutil.rmtree(self.root / topic, ignore_errors=True)
        return freed

    def close(self) -> None:
        for cq in self.by_key.values():
            cq.close()
