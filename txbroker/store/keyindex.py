"""The key index: message key, message id and idempotency key → commit-log offsets, on disk.

A chained hash table in fixed-size index files (RocketMQ's IndexFile design), so memory stays
bounded however many keys are written: the kernel pages the files in and out. A file is a
header (``INDEX_HEADER``), ``slot_count`` slots (``SLOT``) and ``capacity`` entries
(``INDEX_ENTRY``). Lookups return candidate offsets; the store reads each record and keeps those
whose key really matches, so hash collisions and stale entries (past a truncated tail) can only
cost a read. Files are named by the physical offset of their first record (20 digits).
"""

from __future__ import annotations

import enum
import logging
import struct
import zlib
from pathlib import Path
from typing import Final

import google_crc32c

from txbroker.errors import CorruptLog
from txbroker.store.mapped import MappedFile, remove_temporaries

log = logging.getLogger(__name__)

__all__ = ["IndexFile", "KeyIndex", "KeyKind"]

INDEX_HEADER: Final = struct.Struct(
    "<"
    "I"  # 0   magic: INDEX_MAGIC
    "I"  # 4   version
    "I"  # 8   slot_count: hash slots
    "I"  # 12  capacity: entry capacity
    "I"  # 16  count: entries used (written at flush; recovery trusts the checkpoint)
    "I"  # 20  reserved
    "Q"  # 24  begin_phys: commit-log offset of the first indexed record
    "Q"  # 32  end_phys: commit-log offset of the last indexed record
    "Q"  # 40  begin_ms: store time of the first indexed record
    "Q"  # 48  end_ms: store time of the last indexed record
    "Q"  # 56  reserved
)
INDEX_ENTRY: Final = struct.Struct(
    "<"
    "Q"  # 0   key_hash: hash of (kind, key)
    "Q"  # 8   phys: commit-log offset of the record
    "I"  # 16  prev: 1-based number of the previous entry in this chain, 0 = end
    "I"  # 20  store_s: store time in seconds (low 32 bits), for window filtering
)
# INDEX_ENTRY with key_hash as its two 32-bit halves, low first (the same bytes, little-endian):
# written from the two CRCs themselves, the compiled build never makes the 64-bit hash, an int
# too large for a machine word that every operation on it would allocate.
_ENTRY_HALVES: Final = struct.Struct("<IIQII")
# 1-based number of the newest entry in the slot's chain, 0 = empty.
SLOT: Final = struct.Struct("<I")
assert INDEX_HEADER.size == 64
assert INDEX_ENTRY.size == 24 == _ENTRY_HALVES.size
assert SLOT.size == 4  # the hot path below uses the sizes as literals
_SLOTS_AT: Final = INDEX_HEADER.size
_pack_entry: Final = _ENTRY_HALVES.pack_into
_pack_slot: Final = SLOT.pack_into
_unpack_slot: Final = SLOT.unpack_from
INDEX_MAGIC: Final = 0x58444958  # b"XIDX"
INDEX_VERSION: Final = 1
NAME_DIGITS: Final = 20


class KeyKind(enum.IntEnum):
    KEY = 1
    MESSAGE_ID = 2
    IDEMPOTENCY_KEY = 3
    INTERNAL = 4  # broker-internal dedup keys (scheduler hops), never shown to users


def key_hash(kind: int, key: str) -> int:
    data = key.encode()
    # Two different CRC polynomials give 64 reasonably independent bits cheaply.
    low: int = google_crc32c.value(data)
    return (zlib.crc32(data, kind) << 32) | low


class IndexFile:
    __slots__ = (
        "_entries_at",
        "_high_mod",
        "begin_ms",
        "begin_phys",
        "capacity",
        "count",
        "end_ms",
        "end_phys",
        "f",
        "slots",
    )

    def __init__(self, f: MappedFile) -> None:
        self.f = f
        magic, version, slots, capacity, count, _r, bp, ep, bm, em, _r2 = INDEX_HEADER.unpack_from(
            f.mm, 0
        )
        if magic != INDEX_MAGIC or version != INDEX_VERSION:
            raise CorruptLog(f"{f.path} is not a version {INDEX_VERSION} index file")
        self.slots: int = slots
        self.capacity: int = capacity
        self.count: int = count
        self.begin_phys: int = bp
        self.end_phys: int = ep
        self.begin_ms: int = bm
        self.end_ms: int = em
        self._entries_at: int = INDEX_HEADER.size + slots * SLOT.size
        # 2**32 mod slots: h % slots == (high * _high_mod + low) % slots for h == high << 32 | low
        self._high_mod: int = (1 << 32) % slots

    @classmethod
    def create(cls, path: Path, base_phys: int, slots: int, capacity: int) -> IndexFile:
        size = INDEX_HEADER.size + slots * SLOT.size + capacity * INDEX_ENTRY.size
        head = INDEX_HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, slots, capacity, 0, 0, base_phys, base_phys, 0, 0, 0
        )
        f = MappedFile.create(path, base_phys, size, head)
        return cls(f)

    @property
    def full(self) -> bool:
        return self.count >= self.capacity

    def _entry_pos(self, number: int) -> int:  # number is 1-based
        return self._entries_at + (number - 1) * INDEX_ENTRY.size

    def add(self, high: int, low: int, phys: int, store_ms: int) -> None:
        """Add the entry of key hash ``high << 32 | low`` (see KeyIndex.add)."""
        mm = self.f.mm
        slot_pos = _SLOTS_AT + ((high * self._high_mod + low) % self.slots) * 4
        head = _unpack_slot(mm, slot_pos)[0]
        number = self.count + 1
        _pack_entry(
            mm,
            self._entries_at + (number - 1) * 24,
            low,
            high,
            phys,
            head,
            (store_ms // 1000) & 0xFFFFFFFF,
        )
        # Entry first, then count, then slot: a crash between them orphans the entry (replay
        # re-adds it) but never links a slot to an entry that was not written.
        self.count = number
        _pack_slot(mm, slot_pos, number)
        if number == 1:
            self.begin_phys, self.begin_ms = phys, store_ms
        self.end_phys, self.end_ms = phys, store_ms

    def find(self, h: int, limit: int) -> list[int]:
        mm = self.f.mm
        (number,) = SLOT.unpack_from(mm, INDEX_HEADER.size + (h % self.slots) * SLOT.size)
        out: list[int] = []
        # Chains mix keys that share a slot (about two per slot at capacity); bound the walk so
        # a pathological slot costs a bounded amount per lookup, not a scan of the file.
        steps = limit * 64 + 1024
        while number and len(out) < limit and steps:
            steps -= 1
            if number > self.count:
                break  # a link past the trusted count: stale after a crash, ignore
            eh, phys, prev, _ = INDEX_ENTRY.unpack_from(mm, self._entry_pos(number))
            if eh == h:
                out.append(phys)
            if prev >= number:
                break  # chains only point backwards; anything else is damage
            number = prev
        return out

    def write_header(self) -> None:
        INDEX_HEADER.pack_into(
            self.f.mm,
            0,
            INDEX_MAGIC,
            INDEX_VERSION,
            self.slots,
            self.capacity,
            self.count,
            0,
            self.begin_phys,
            self.end_phys,
            self.begin_ms,
            self.end_ms,
            0,
        )

    def relink(self, count: int) -> None:
        """Rebuild every slot and chain from entries [1, count]: after a crash only entries
        covered by the checkpoint are trusted, and slots may point at lost ones."""
        mm = self.f.mm
        slots_start = INDEX_HEADER.size
        mm[slots_start : slots_start + self.slots * SLOT.size] = bytes(self.slots * SLOT.size)
        heads = [0] * self.slots
        start = self._entry_pos(1)
        raw = mm[start : start + count * INDEX_ENTRY.size]
        nslots = self.slots
        for number, (h, phys, _prev, ts) in enumerate(INDEX_ENTRY.iter_unpack(raw), start=1):
            s = h % nslots
            INDEX_ENTRY.pack_into(
                mm, start + (number - 1) * INDEX_ENTRY.size, h, phys, heads[s], ts
            )
            heads[s] = number
        mm[slots_start : slots_start + self.slots * SLOT.size] = struct.pack(
            f"<{self.slots}I", *heads
        )
        self.count = count
        # Zero what follows so stale entries cannot be mistaken for live ones later.
        tail = self._entry_pos(count + 1)
        end = self._entry_pos(self.capacity + 1)
        if tail < end:
            mm[tail:end] = bytes(end - tail)
        if count:
            _, self.end_phys, _, ts = INDEX_ENTRY.unpack_from(mm, self._entry_pos(count))
            self.end_ms = ts * 1000


_crc32: Final = zlib.crc32
_crc32c: Final = google_crc32c.value


class KeyIndex:
    """All index files of a store, oldest first; only the last one is written."""

    def __init__(self, directory: Path, slots: int, capacity: int) -> None:
        self.dir = directory
        self.slot_count = slots
        self.capacity = capacity
        self.files: list[IndexFile] = []
        self._unsynced: list[IndexFile] = []  # filled files not yet made durable

    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        remove_temporaries(self.dir)
        for p in sorted(self.dir.iterdir()):
            if p.name.isdigit() and len(p.name) == NAME_DIGITS:
                f = MappedFile.open(p, int(p.name))
                if not any(f.mm[: INDEX_HEADER.size]):
                    # Created but its header never reached the disk (the machine went down
                    # before a sync): it indexes nothing durable, and recovery re-indexes the
                    # records past the checkpoint from the commit log.
                    log.warning("removing %s: an index file whose creation never finished", p)
                    f.close(unlink=True)
                    continue
                self.files.append(IndexFile(f))

    def reserve(self, entries: int, phys: int) -> None:
        """Make room for ``entries`` entries of records from ``phys`` on, starting a new file
        if the active one lacks it, so indexing them cannot fail for want of space (an append
        allocates everything before it writes anything). Raises StoreFailed or OSError when the
        file cannot be created; nothing is written then."""
        files = self.files
        if entries and (not files or files[-1].count + min(entries, self.capacity) > self.capacity):
            self._new_file(phys)

    def _new_file(self, phys: int) -> None:
        files = self.files
        if files and files[-1].f.base >= phys:
            if not files[-1].count:
                return  # reserved already (and left empty by an append that failed after it)
            phys = files[-1].f.base + 1  # one record fills a file: names stay unique, in order
        path = self.dir / f"{phys:0{NAME_DIGITS}d}"
        if path.exists():  # same start offset: a replay re-indexing this record
            path.unlink()
        new = IndexFile.create(path, phys, self.slot_count, self.capacity)
        if files:
            files[-1].write_header()
            self._unsynced.append(files[-1])
        files.append(new)

    def add(self, kind: int, key: str, phys: int, store_ms: int) -> None:
        files = self.files
        if not files or files[-1].full:
            self._new_file(phys)
        data = key.encode()
        # key_hash's two halves, inlined: this runs for every id, key and idempotency key
        # appended.
        files[-1].add(_crc32(data, kind), _crc32c(data), phys, store_ms)

    def find(self, kind: int, key: str, limit: int = 64, since_ms: int = 0) -> list[int]:
        """Candidate offsets, newest first, for files whose records may be newer than since_ms."""
        h = key_hash(kind, key)
        out: list[int] = []
        for f in reversed(self.files):
            if f.count and f.end_ms and f.end_ms < since_ms:
                break
            out.extend(f.find(h, limit - len(out)))
            if len(out) >= limit:
                break
        return out

    def sync(self, *, everything: bool = False) -> None:
        """fdatasync the active file and any that filled up since the last sync."""
        full, self._unsynced = self._unsynced, []
        targets = self.files if everything else [*full, *self.files[-1:]]
        for f in targets:
            f.write_header()
            if f.f.retain():
                try:
                    f.f.sync()
                finally:
                    f.f.release()

    def state(self) -> tuple[int, int]:
        """(base of the active file, its entry count): what a checkpoint records."""
        if not self.files:
            return (-1, 0)
        return (self.files[-1].f.base, self.files[-1].count)

    def drop_before_phys(self, log_min: int) -> list[MappedFile]:
        dead: list[MappedFile] = []
        while len(self.files) > 1 and self.files[0].end_phys < log_min:
            dead.append(self.files.pop(0).f)
        return dead

    def close(self) -> None:
        for f in self.files:
            f.write_header()
            f.f.close()
        self.files.clear()
