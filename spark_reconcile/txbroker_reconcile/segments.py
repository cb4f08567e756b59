"""Reading commit-log segment files into Arrow record batches, one row per record.

The only place the reconciliation reads the broker's bytes, through the broker's own record
layout (:mod:`txbroker.store.record`), so the layout stays written once. It needs no Spark: the
data source (:mod:`.logsource`) calls it per segment, ``txbroker log export`` to write Parquet.
A damaged record becomes a row with ``corrupt`` set to the reason, and the reader goes on from
the next record that checks (magic, sizes, CRC). Damage at the very end of the newest segment
is the record the broker is writing now: the read stops before it, and a later run starts there.

A running broker's log can be read: records are written once and never changed, each checked
by its CRC; a segment is only ever appended to, or deleted whole by retention. A segment the
listing named but retention deleted before it was opened cannot be read: the read stops with
:func:`segment_gone` (once open, a deleted file stays readable to the end).
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec
import pyarrow as pa

from txbroker.errors import CorruptLog
from txbroker.store.record import (
    HEADER,
    MAGIC_BLANK,
    MAGIC_MESSAGE,
    PROP_IDEMPOTENCY_KEY,
    PROP_INTERNAL_KEY,
    PROP_KEYS,
    PROP_MESSAGE_ID,
    PROP_TAGS,
    SIZE_MAGIC,
    check_record,
)
from txbroker.tx.state import (
    PROP_BY,
    PROP_GROUP,
    PROP_HALF_PHYS,
    PROP_OP,
    PROP_STATE,
    PROP_TARGET_TOPIC,
    PROP_TIMEOUT,
    PROP_TX,
)
from txbroker_reconcile.errors import CannotRun

__all__ = [
    "GONE",
    "LOG_SCHEMA",
    "Segment",
    "SegmentScan",
    "find_segments",
    "gone_in",
    "read_segment",
    "segment_gone",
]

# Segment files are named by their 20-digit starting offset (see txbroker/store/commitlog.py).
_SEGMENT_NAME: Final = re.compile(r"\d{20}")
_MAGIC_BYTES: Final = MAGIC_MESSAGE.to_bytes(4, "little")
BATCH_ROWS: Final = 65_536

LOG_SCHEMA: Final = pa.schema(
    [
        ("segment", pa.string()),
        ("position", pa.int64()),  # physical offset in the log
        ("size", pa.int32()),
        ("flags", pa.int32()),
        ("topic", pa.string()),
        ("queue_id", pa.int32()),
        ("queue_offset", pa.int64()),
        ("born_ms", pa.int64()),
        ("store_ms", pa.int64()),
        ("message_id", pa.string()),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("idempotency_key", pa.string()),
        ("internal_key", pa.string()),
        ("tx_id", pa.string()),
        ("tx_op", pa.string()),  # commit | rollback | park | resume, on op records
        ("op_by", pa.string()),  # producer | check | operator
        ("producer_group", pa.string()),
        ("target_topic", pa.string()),  # a half message's topic once committed
        ("timeout_ms", pa.int64()),  # a half message's first back-check delay
        ("half_position", pa.int64()),  # an op record's half message
        # prepared | parked, on a half message copied forward (it outlives retention): the
        # transaction's state when copied
        ("tx_state", pa.string()),
        ("body_bytes", pa.int32()),
        ("corrupt", pa.string()),  # why this position does not hold a valid record, else null
    ]
)
_NO_RECORD: Final = (None,) * (len(LOG_SCHEMA) - 3)  # a corrupt row: position and reason only
_TAIL: Final = (
    " at the end of the segment being written (a record being written as it was read, or "
    "cut short by a crash: the broker's recovery drops it)"
)
# What a read says of a listed segment file that is gone: Spark hands an executor's error to
# the driver as text, where :func:`gone_in` finds these words.
GONE: Final = "was deleted after the job listed the log's segments"


def segment_gone(path: str) -> CannotRun:
    return CannotRun(
        f"segment {path} {GONE} (the broker's retention deletes its oldest segments while it "
        "runs): run the job again"
    )


def gone_in(error: BaseException) -> CannotRun | None:
    """The :func:`segment_gone` error carried in a failed Spark job's ``error``, if any."""
    line = next((ln for ln in str(error).splitlines() if GONE in ln), None)
    if line is None:
        return None
    return CannotRun(line[line.index("segment ") :].strip())


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment file to read, from ``start`` (bytes into the file) on."""

    path: str
    base: int  # the log's physical offset of the file's first byte
    start: int = 0
    newest: bool = False  # the broker may be writing its tail


def find_segments(log_dir: str | os.PathLike[str]) -> list[Segment]:
    """The segment files of a broker's data directory (``<dir>/store/commitlog``) or of the
    folder holding them, oldest first; raise :class:`CannotRun` naming the directory when
    there are none."""
    root = Path(log_dir)
    if not root.is_dir():
        raise CannotRun(f"log directory {str(root)!r} does not exist or is not a directory")
    folder = next(
        (f for f in (root / "store" / "commitlog", root / "commitlog") if f.is_dir()), root
    )
    names = sorted(p.name for p in folder.iterdir() if _SEGMENT_NAME.fullmatch(p.name))
    if not names:
        raise CannotRun(
            f"no commit-log segments in {str(folder)!r}: pass the broker's --data-dir, its "
            "store/commitlog/ folder, or a Parquet export from `txbroker log export`"
        )
    # The broker creates the next segment before it is needed, so the file it is writing is
    # the last one holding data, not always the last file.
    paths = [folder / n for n in names]
    writing = next((i for i in reversed(range(len(paths))) if _has_data(paths[i])), 0)
    return [Segment(str(p), int(p.name), 0, newest=i >= writing) for i, p in enumerate(paths)]


def _has_data(path: Path) -> bool:
    with open(path, "rb") as f:
        return any(f.read(SIZE_MAGIC.size))


class _Props(msgspec.Struct, frozen=True, gc=False):
    """The properties the job reads, in LOG_SCHEMA's order, decoded straight from a record's
    msgpack map (unknown properties skipped; numbers written as strings read as ints)."""

    message_id: str | None = msgspec.field(default=None, name=PROP_MESSAGE_ID)
    keys: str | None = msgspec.field(default=None, name=PROP_KEYS)
    tags: str | None = msgspec.field(default=None, name=PROP_TAGS)
    idempotency_key: str | None = msgspec.field(default=None, name=PROP_IDEMPOTENCY_KEY)
    internal_key: str | None = msgspec.field(default=None, name=PROP_INTERNAL_KEY)
    tx_id: str | None = msgspec.field(default=None, name=PROP_TX)
    tx_op: str | None = msgspec.field(default=None, name=PROP_OP)
    op_by: str | None = msgspec.field(default=None, name=PROP_BY)
    producer_group: str | None = msgspec.field(default=None, name=PROP_GROUP)
    target_topic: str | None = msgspec.field(default=None, name=PROP_TARGET_TOPIC)
    timeout_ms: int | None = msgspec.field(default=None, name=PROP_TIMEOUT)
    half_position: int | None = msgspec.field(default=None, name=PROP_HALF_PHYS)
    tx_state: str | None = msgspec.field(default=None, name=PROP_STATE)


_props_decoder: Final = msgspec.msgpack.Decoder(_Props, strict=False)
_NO_PROPS: Final = msgspec.structs.astuple(_Props())
assert _Props.__struct_fields__ == tuple(LOG_SCHEMA.names[9:22])


class _Rows:
    """Rows gathered as tuples and turned into columns once per batch (one tuple per record
    is cheaper than one list append per field)."""

    def __init__(self, segment: str) -> None:
        self.segment = segment
        self.rows: list[tuple[object, ...]] = []

    def flush(self) -> pa.RecordBatch:
        columns = list(zip(*self.rows, strict=True))
        arrays = [pa.array([self.segment] * len(self.rows), type=pa.string())]
        arrays += [
            pa.array(col, type=f.type) for col, f in zip(columns, list(LOG_SCHEMA)[1:], strict=True)
        ]
        self.rows = []
        return pa.RecordBatch.from_arrays(arrays, schema=LOG_SCHEMA)


def read_segment(seg: Segment, *, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Yield the segment's records from ``seg.start`` as Arrow batches (use
    :class:`SegmentScan` when where it stopped matters)."""
    yield from SegmentScan(seg, batch_rows)


class SegmentScan:
    """An iterable over one segment's batches that remembers where it stopped: ``end`` is the
    file position after the last whole record (where an incremental run resumes)."""

    def __init__(self, seg: Segment, batch_rows: int = BATCH_ROWS) -> None:
        self.seg = seg
        self.batch_rows = batch_rows
        self.end = seg.start
        self.records = 0
        self.corrupt = 0

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        try:
            f = open(self.seg.path, "rb")  # noqa: SIM115 - closed below, after the mapping
        except FileNotFoundError:
            raise segment_gone(self.seg.path) from None
        except OSError as e:
            raise CorruptLog(f"cannot read segment {self.seg.path}: {e.strerror}") from e
        with f:
            size = os.fstat(f.fileno()).st_size
            if size <= self.seg.start:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                yield from self._scan(mm, size)

    def _scan(self, mm: mmap.mmap, size: int) -> Iterator[pa.RecordBatch]:
        out = _Rows(os.path.basename(self.seg.path))
        rows = out.rows
        base = self.seg.base
        unpack = HEADER.unpack_from
        decode = _props_decoder.decode
        astuple = msgspec.structs.astuple
        topics: dict[bytes, str] = {}  # few topics, many records: decode each name once
        pos = self.seg.start
        while pos + SIZE_MAGIC.size <= size:
            total, magic = SIZE_MAGIC.unpack_from(mm, pos)
            if magic == MAGIC_BLANK:  # filler to the end of the segment
                self.end = size
                break
            reason = check_record(mm, pos) if total or magic else "zeros inside the data"
            if reason is not None:
                nxt = self._next_valid(mm, pos + 1, size)
                if nxt is None and not (total or magic):
                    break  # zeros with nothing after them: the unwritten tail, the data's end
                if nxt is None and self.seg.newest:
                    reason += _TAIL
                self._corrupt(rows, base + pos, reason)
                if nxt is None:
                    # At the end of the newest segment this may be the record the broker is
                    # writing right now: the end stays before it, so an incremental run reads
                    # this position again next time.
                    break
                pos = self.end = nxt
            else:
                (_t, _m, _c, flags, qid, qoff, _p, born, store, body_len, props_len, topic_len) = (
                    unpack(mm, pos)
                )
                p = pos + HEADER.size
                raw = mm[p : p + topic_len]
                topic = topics.get(raw)
                if topic is None:
                    topic = topics[raw] = raw.decode()
                p += topic_len
                props = astuple(decode(mm[p : p + props_len])) if props_len else _NO_PROPS
                rows.append(
                    (
                        base + pos,
                        total,
                        flags,
                        topic,
                        qid,
                        qoff,
                        born,
                        store,
                        *props,
                        body_len,
                        None,
                    )
                )
                self.records += 1
                pos = self.end = pos + total
            if len(rows) >= self.batch_rows:
                yield out.flush()
                rows = out.rows
        else:
            self.end = max(self.end, pos)
        if rows:
            yield out.flush()

    def _corrupt(self, rows: list[tuple[object, ...]], position: int, reason: str) -> None:
        self.corrupt += 1
        rows.append((position, *_NO_RECORD, reason))

    @staticmethod
    def _next_valid(mm: mmap.mmap, start: int, size: int) -> int | None:
        """The next position after ``start`` where a whole valid record begins (its magic found
        with a C-speed search, then checked), or None."""
        i = mm.find(_MAGIC_BYTES, start + 4)
        while i != -1:
            cand = i - 4
            if cand >= start and check_record(mm, cand) is None:
                return cand
            i = mm.find(_MAGIC_BYTES, i + 1)
        return None
