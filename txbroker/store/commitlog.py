"""The commit log: one append-only sequence of records for all topics, in fixed-size segments.

Segment files live in ``<data>/commitlog/`` and are named by their 20-digit starting physical
offset, so the name alone places a file in the log. The log's physical offset space is
contiguous: segment N+1 starts where segment N ends, whatever the files' sizes (a change of the
configured segment size applies to new segments only).

Only the event-loop thread appends; the syncer process only calls ``fdatasync``; readers in
worker threads use ``pread`` on files they have retained. So the write path needs no lock.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import errno
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final, NamedTuple

from txbroker.errors import CorruptLog, InvalidOffset, NotFound, StoreError, StoreFailed
from txbroker.store.mapped import MappedFile, fsync_dir, remove_temporaries
from txbroker.store.record import (
    HEADER,
    MAGIC_BLANK,
    MAGIC_MESSAGE,
    SIZE_MAGIC,
    StoredMessage,
    check_record,
    decode_record,
    encode_record_parts,
)

__all__ = ["CommitLog", "ScanEnd", "ScannedRecord", "read_log_files"]

log = logging.getLogger(__name__)

NAME_DIGITS: Final = 20
_ZERO_CHUNK: Final = bytes(1 << 20)
_MAGIC_BYTES: Final = MAGIC_MESSAGE.to_bytes(4, "little")
_HEADER_BYTES: Final = HEADER.size


class ScannedRecord(NamedTuple):
    """A verified record seen by a recovery or replay scan (header fields plus raw parts)."""

    phys: int
    size: int
    flags: int
    queue_id: int
    queue_offset: int
    store_ms: int
    topic: str
    props: bytes


class ScanEnd(NamedTuple):
    """Where a scan stopped: ``end`` is the first byte after the last valid record."""

    end: int
    reason: str | None  # None: clean end of data; else why the record at ``end`` is invalid


def _data_ranges(seg: MappedFile, start: int) -> Iterator[tuple[int, int]]:
    """Ranges [lo, hi) from ``start`` on that may hold non-zero bytes. The file system reports
    never-written (preallocated) ranges as holes, so a mostly empty segment is not read."""
    pos = start
    while pos < seg.size:
        try:
            lo = os.lseek(seg.fd, pos, os.SEEK_DATA)
            hi = os.lseek(seg.fd, lo, os.SEEK_HOLE)
        except OSError:  # ENXIO: no data past pos (or SEEK_DATA unsupported: see below)
            if pos == start and not _seek_data_works(seg):
                yield (start, seg.size)
            return
        lo, hi = max(lo, start), min(hi, seg.size)
        if lo >= hi:
            return
        yield (lo, hi)
        pos = hi


def _seek_data_works(seg: MappedFile) -> bool:
    try:
        os.lseek(seg.fd, 0, os.SEEK_DATA)
    except OSError as e:
        return e.errno == errno.ENXIO  # "no data at all" is a real answer
    return True


def _pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """``os.pwrite`` all of ``data`` or raise. A write that reaches a file size limit
    (RLIMIT_FSIZE) or a quota is cut short without an error; the rest is retried, so the limit
    surfaces as the OSError (EFBIG, ENOSPC, EDQUOT) it is instead of bytes silently missing."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote nothing at offset {offset + done}")
        done += n


class CommitLog:
    def __init__(self, directory: Path, segment_bytes: int, *, buffered: bool = False) -> None:
        self.dir = directory
        self.segment_bytes = segment_bytes
        # Buffered (sync flush mode): records collect in memory and reach the file in one
        # pwrite per group commit, just before its fdatasync. Unbuffered (async mode): each
        # record is written at once, so an acknowledged record survives a process crash.
        self.buffered = buffered
        self._buf = bytearray()
        self._buf_start = 0  # physical offset of _buf[0]
        self.records = 0  # appended since open (statistics)
        self.segments: list[MappedFile] = []
        self._bases: list[int] = []
        self.write_pos = 0  # next physical offset to write; valid once recovered
        self._prealloc: concurrent.futures.Future[MappedFile] | None = None
        self._ready: list[MappedFile] = []  # created segments after the active one, in order
        self._alloc_pool = concurrent.futures.ThreadPoolExecutor(1, "txb-alloc")

    # --- files ----------------------------------------------------------------------------

    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_temporaries(self.dir)
        names = sorted(p for p in self.dir.iterdir() if p.name.isdigit())
        for p in names:
            if len(p.name) != NAME_DIGITS:
                raise CorruptLog(f"unexpected file {p} in the commit log directory")
            seg = MappedFile.open(p, int(p.name))
            if self.segments:
                prev = self.segments[-1]
                if prev.base + prev.size != seg.base:
                    raise CorruptLog(
                        f"commit log gap: {prev.path.name} ends at {prev.base + prev.size}, "
                        f"next segment starts at {seg.base}"
                    )
            self._add(seg)
        if not self.segments:
            self._add(MappedFile.create(self._path(0), 0, self.segment_bytes))

    def _path(self, base: int) -> Path:
        return self.dir / f"{base:0{NAME_DIGITS}d}"

    def _add(self, seg: MappedFile) -> None:
        self.segments.append(seg)
        self._bases.append(seg.base)

    @property
    def min_offset(self) -> int:
        return self.segments[0].base

    def segment_for(self, phys: int) -> MappedFile:
        i = bisect.bisect_right(self._bases, phys) - 1
        if i < 0 or phys >= self.segments[i].base + self.segments[i].size:
            raise NotFound(f"physical offset {phys} is not in the log (deleted or never written)")
        return self.segments[i]

    def _start_prealloc(self, base: int) -> None:
        # Creating and reserving a segment takes a few ms; do it ahead, off the event loop.
        path, size = self._path(base), self.segment_bytes
        self._prealloc = self._alloc_pool.submit(MappedFile.create, path, base, size)

    def _next_segment(self, i: int) -> MappedFile:
        """The ``i``-th segment after the active one, created now if it is not ready yet; it
        joins the log only when an append rolls into it. Raises StoreFailed (nothing changed)
        when it cannot be created: a full disk fails an append before anything is written."""
        while len(self._ready) <= i:
            prev = self._ready[-1] if self._ready else self.segments[-1]
            base = prev.base + prev.size
            fut, self._prealloc = self._prealloc, None
            seg: MappedFile | None = None
            if fut is not None:
                try:
                    seg = fut.result()  # normally long done; blocks only if appends outran it
                except (OSError, StoreFailed):
                    seg = None  # retried here, in the append that needs it
                if seg is not None and seg.base != base:  # pragma: no cover - defensive
                    seg.close()
                    seg = None
            if seg is None:
                existing = self._path(base)
                if existing.exists():
                    seg = MappedFile.open(existing, base)
                else:
                    seg = MappedFile.create(existing, base, self.segment_bytes)
            self._ready.append(seg)
        return self._ready[i]

    def reserve(self, sizes: list[int]) -> int:
        """Make sure every segment records of ``sizes`` (appended next, in order) will need
        exists; return where the first of them will be written."""
        active = self.segments[-1]
        end, pos, k = active.base + active.size, self.write_pos, 0
        if len(sizes) == 1 and pos + sizes[0] <= end:
            return pos  # the common case: one record, room in the active segment
        first = -1
        for size in sizes:
            if pos + size > end:
                seg = self._next_segment(k)
                k += 1
                pos, end = seg.base, seg.base + seg.size
            if first < 0:
                first = pos
            pos += size
        return first if first >= 0 else self.write_pos

    def reserve_one(self, size: int) -> int:
        """:meth:`reserve` for one record of ``size`` bytes, without the list."""
        active = self.segments[-1]
        if self.write_pos + size <= active.base + active.size:
            return self.write_pos
        return self.reserve([size])

    def _roll(self, active: MappedFile) -> MappedFile:
        seg = self._next_segment(0)  # first: a failure here leaves the log as it was
        self.write_buffer()
        rel = self.write_pos - active.base
        remaining = active.size - rel
        if remaining >= SIZE_MAGIC.size:
            _pwrite_all(active.fd, SIZE_MAGIC.pack(remaining, MAGIC_BLANK), rel)
        self._ready.pop(0)
        self._add(seg)
        self.write_pos = self._buf_start = seg.base
        if not self._ready and self._prealloc is None:
            self._start_prealloc(seg.base + seg.size)
        return seg

    # --- append ---------------------------------------------------------------------------

    def append(
        self,
        topic_bytes: bytes,
        props: bytes,
        body: bytes,
        flags: int,
        queue_id: int,
        queue_offset: int,
        born_ms: int,
        store_ms: int,
    ) -> tuple[int, int]:
        """Write one record at the end of the log; return (physical offset, size)."""
        active = self.segments[-1]
        size = _HEADER_BYTES + len(topic_bytes) + len(props) + len(body)
        if self.write_pos + size > active.base + active.size:
            active = self._roll(active)
        phys = self.write_pos
        prefix, rest = encode_record_parts(
            topic_bytes, props, body, flags, queue_id, queue_offset, phys, born_ms, store_ms
        )
        if self.buffered:
            buf = self._buf
            buf += prefix
            buf += rest
        else:
            _pwrite_all(active.fd, prefix + rest, phys - active.base)
        self.write_pos = phys + size
        self.records += 1
        return phys, size

    def write_buffer(self) -> None:
        """Hand buffered records to the kernel (one pwrite; they never span segments)."""
        if self._buf:
            seg = self.segments[-1]
            _pwrite_all(seg.fd, self._buf, self._buf_start - seg.base)
            self._buf.clear()
        self._buf_start = self.write_pos

    # --- replication ----------------------------------------------------------------------

    def read_raw(self, start: int, limit: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole records from ``start`` (a record boundary) up to ``limit`` (the flushed
        offset), at most ``max_bytes`` unless the first record alone is larger; and where the
        next read starts. A segment's end is sent as it is on disk (its BLANK filler, or the
        few zero bytes too small for one) with the next segment's start as the next offset,
        so a replica writing the bytes verbatim rolls its segments at the same offsets."""
        if start >= limit:
            return b"", start
        seg = self.segment_for(start)
        mm, base = seg.mm, seg.base
        seg_end = base + seg.size
        end = min(limit, seg_end)
        pos = start
        while pos < end:
            if seg_end - pos < SIZE_MAGIC.size:
                return bytes(mm[start - base : pos - base]), seg_end  # zeros: the segment is done
            total, magic = SIZE_MAGIC.unpack_from(mm, pos - base)
            if magic == MAGIC_BLANK:
                return bytes(mm[start - base : pos - base + SIZE_MAGIC.size]), seg_end
            if seg_end - pos < HEADER.size:
                return bytes(mm[start - base : pos - base]), seg_end
            if magic != MAGIC_MESSAGE or total < HEADER.size or pos + total > end:
                raise CorruptLog(f"no record at flushed offset {pos} (magic 0x{magic:08x})")
            if pos > start and pos + total - start > max_bytes:
                break
            pos += total
        return bytes(mm[start - base : pos - base]), pos

    def append_raw(self, phys: int, data: bytes, next_phys: int) -> None:
        """Write records another log holds at the same offsets (a replica following its
        master, see ``read_raw``): ``data`` goes at ``phys``, the end of this log, and when
        ``next_phys`` is past it, the next segment starts there. The caller has verified the
        records; nothing else appends to a replica's log."""
        self.write_buffer()  # empty on a replica; keeps the buffer's invariant all the same
        active = self.segments[-1]
        seg_end = active.base + active.size
        if phys != self.write_pos or phys + len(data) > seg_end:
            raise InvalidOffset(
                f"replicated bytes [{phys}, {phys + len(data)}) do not continue this log "
                f"(end {self.write_pos}, segment ends at {seg_end}): the master's segments "
                "must be as large as this broker's (--segment-mib)"
            )
        if data:
            _pwrite_all(active.fd, data, phys - active.base)
            self.write_pos = self._buf_start = phys + len(data)
        if next_phys > self.write_pos:
            if next_phys != seg_end:
                raise InvalidOffset(
                    f"the master's next segment starts at {next_phys}, this broker's at "
                    f"{seg_end}: give both the same --segment-mib"
                )
            seg = self._next_segment(0)
            self._ready.pop(0)
            self._add(seg)
            self.write_pos = self._buf_start = seg.base
            if not self._ready and self._prealloc is None:
                self._start_prealloc(seg.base + seg.size)

    # --- read -----------------------------------------------------------------------------

    def read_inline(self, phys: int) -> bytes:
        """Read one record's bytes from the mapping (call only for recently written data)."""
        if phys >= self.write_pos:
            raise NotFound(f"physical offset {phys} is past the end of the log ({self.write_pos})")
        if phys >= self._buf_start and self._buf:
            rel = phys - self._buf_start
            total, magic = SIZE_MAGIC.unpack_from(self._buf, rel)
            if magic != MAGIC_MESSAGE:
                raise InvalidOffset(f"physical offset {phys} is not the start of a record")
            return bytes(self._buf[rel : rel + total])
        seg = self.segment_for(phys)
        rel = phys - seg.base
        total, magic = SIZE_MAGIC.unpack_from(seg.mm, rel)
        self._check_readable(phys, total, magic, seg)
        return seg.mm[rel : rel + total]

    def read_cold(self, phys: int) -> bytes:
        """Read one record with ``pread`` from a retained file; safe in a worker thread."""
        seg = self.segment_for(phys)
        if not seg.retain():
            raise NotFound(f"physical offset {phys} was deleted by retention")
        try:
            rel = phys - seg.base
            head = seg.pread(rel, 4096)
            if len(head) < SIZE_MAGIC.size:
                raise NotFound(f"nothing stored at physical offset {phys}")
            total, magic = SIZE_MAGIC.unpack_from(head)
            self._check_readable(phys, total, magic, seg)
            if total <= len(head):
                return head[:total]
            return head + seg.pread(rel + len(head), total - len(head))
        except OSError as e:  # EIO from a failing disk: a store error naming where, not a crash
            raise StoreError(
                f"reading the record at physical offset {phys} from {seg.path} failed: {e}"
            ) from e
        finally:
            seg.release()

    def _check_readable(self, phys: int, total: int, magic: int, seg: MappedFile) -> None:
        if phys >= self.write_pos:
            raise NotFound(f"physical offset {phys} is past the end of the log ({self.write_pos})")
        if magic != MAGIC_MESSAGE or total < HEADER.size or phys - seg.base + total > seg.size:
            raise InvalidOffset(f"physical offset {phys} is not the start of a record")

    # --- recovery -------------------------------------------------------------------------

    def scan(self, start: int, end_out: list[ScanEnd]) -> Iterator[ScannedRecord]:
        """Yield every valid record from ``start`` on; append where and why it stopped to
        ``end_out``. ``start`` must be a record boundary (a checkpoint or a segment start)."""
        if start < self.min_offset:
            start = self.min_offset
        i = bisect.bisect_right(self._bases, start) - 1
        pos = start
        while i < len(self.segments):
            seg = self.segments[i]
            mm, base, size = seg.mm, seg.base, seg.size
            rel = pos - base
            while True:
                if size - rel < HEADER.size:
                    break  # remainder too small for any record: the segment is full
                total, magic = SIZE_MAGIC.unpack_from(mm, rel)
                if magic == MAGIC_BLANK and total == size - rel:
                    break
                if total == 0 and magic == 0:
                    end_out.append(ScanEnd(base + rel, None))
                    return
                reason = check_record(mm[rel : rel + min(total, size - rel)]) if total else "zero"
                if reason is not None:
                    end_out.append(ScanEnd(base + rel, reason))
                    return
                (_, _, _, flags, qid, qoff, phys, _born, store, _bl, plen, tlen) = (
                    HEADER.unpack_from(mm, rel)
                )
                if phys != base + rel:
                    end_out.append(ScanEnd(base + rel, f"record claims offset {phys}"))
                    return
                p = rel + HEADER.size
                topic = mm[p : p + tlen].decode()
                props = mm[p + tlen : p + tlen + plen]
                yield ScannedRecord(base + rel, total, flags, qid, qoff, store, topic, props)
                rel += total
            i += 1
            pos = base + size
        end_out.append(ScanEnd(pos, None))

    def find_valid_after(self, pos: int) -> int | None:
        """The offset of a valid record after ``pos``, if any: tells mid-log corruption from a
        torn tail. Runs only in recovery; unwritten ranges are skipped with SEEK_DATA instead of
        being read, so an empty preallocated tail costs nothing."""
        i = bisect.bisect_right(self._bases, pos) - 1
        while i < len(self.segments):
            seg = self.segments[i]
            for lo, hi in _data_ranges(seg, max(pos - seg.base + 1, 0)):
                rel = lo
                while (hit := seg.mm.find(_MAGIC_BYTES, rel, hi)) != -1:
                    start = hit - 4
                    if start >= 0 and check_record(seg.mm, start) is None:
                        return seg.base + start
                    rel = hit + 1
            i += 1
        return None

    def truncate(self, end: int, *, clear_tail: bool) -> int:
        """Make ``end`` the end of the log and drop every segment after the one holding it.

        With ``clear_tail``, zero what lies past ``end`` in that segment (a torn record, garbage)
        so the invariant "zeros follow the data" holds again; returns how many non-zero bytes
        were cleared. Callers have checked that no valid record lies past ``end``."""
        seg = self.segment_for_end(end)
        cleared = 0
        if clear_tail:
            chunk = len(_ZERO_CHUNK)
            for lo, hi in _data_ranges(seg, end - seg.base):
                for rel in range(lo, hi, chunk):
                    n = min(chunk, hi - rel)
                    zeros = seg.mm[rel : rel + n].count(0)
                    if zeros != n:
                        cleared += n - zeros
                        seg.mm[rel : rel + n] = _ZERO_CHUNK[:n]
            seg.sync()
        dropped = False
        while self.segments[-1] is not seg:
            dead = self.segments.pop()
            self._bases.pop()
            dead.close(unlink=True)
            dropped = True
        if dropped:
            fsync_dir(self.dir)
        self.write_pos = self._buf_start = end
        nxt = seg.base + seg.size
        if self._prealloc is None and not self._path(nxt).exists():
            self._start_prealloc(nxt)
        return cleared

    def segment_for_end(self, end: int) -> MappedFile:
        """The last segment starting at or before ``end``: where the next append goes."""
        i = max(bisect.bisect_right(self._bases, end) - 1, 0)
        return self.segments[i]

    # --- durability and retention ---------------------------------------------------------

    def segments_between(self, start: int, end: int) -> list[MappedFile]:
        """Segments holding bytes in [start, end): what an fdatasync must cover."""
        i = max(bisect.bisect_right(self._bases, start) - 1, 0)
        out = []
        for seg in self.segments[i:]:
            if seg.base >= end:
                break
            out.append(seg)
        return out

    def pop_oldest(self) -> MappedFile:
        """Detach the oldest segment for deletion; the caller closes it with unlink."""
        if len(self.segments) < 2:
            raise StoreFailed("retention never deletes the active segment")
        self._bases.pop(0)
        return self.segments.pop(0)

    def close(self) -> None:
        if self._prealloc is not None:
            try:
                seg = self._prealloc.result()
                seg.close()
            except Exception:  # pragma: no cover - a failed preallocation is retried next open
                log.exception("preallocation of the next segment failed")
            self._prealloc = None
        self._alloc_pool.shutdown(wait=True)
        for seg in [*self.segments, *self._ready]:
            seg.close()
        self._ready.clear()

    def sync_all(self) -> None:
        for seg in self.segments:
            os.fdatasync(seg.fd)


def read_log_files(directory: Path) -> Iterator[StoredMessage]:
    """Every record the segment files in ``directory`` hold now, in log order, read with plain
    reads and without opening the store, so a running broker's log too: each segment up to its
    first position without a whole valid record (its end filler, the zeros after the data, the
    record being written). For looking into a log from outside (tests, a campaign's diagnosis);
    the broker reads through :class:`CommitLog`."""
    for path in sorted(p for p in directory.iterdir() if p.name.isdigit()):
        data = path.read_bytes()
        pos = 0
        while check_record(data, pos) is None:
            rec = decode_record(data, pos)
            yield rec
            pos += rec.size
