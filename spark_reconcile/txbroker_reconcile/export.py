"""``txbroker log export``: the commit log as Parquet, for a job that cannot see the broker's
disk (a cluster). One Parquet file per segment, rows exactly as the log's data source yields
them, so the job reads either the same way. No Spark needed: the export runs beside the broker.

A segment already exported whole (its Parquet file is newer than the segment and the segment is
not the newest) is skipped, so exporting again after more traffic writes only what changed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from txbroker_reconcile.segments import LOG_SCHEMA, SegmentScan, find_segments, segment_gone

__all__ = ["ExportResult", "export_log"]


@dataclass(frozen=True)
class ExportResult:
    files: int
    skipped: int
    records: int
    corrupt: int


def export_log(
    log_dir: str | os.PathLike[str],
    out: Path,
    *,
    on_segment: Callable[[str, int, int], None] | None = None,
) -> ExportResult:
    """Write ``<out>/<segment>.parquet`` per segment; ``on_segment(name, done, total)`` is
    called after each, for progress."""
    out.mkdir(parents=True, exist_ok=True)
    segments = find_segments(log_dir)
    files = skipped = records = corrupt = 0
    for n, seg in enumerate(segments, start=1):
        name = os.path.basename(seg.path)
        target = out / f"{name}.parquet"
        try:
            changed_s = os.stat(seg.path).st_mtime
        except FileNotFoundError:
            raise segment_gone(seg.path) from None
        if not seg.newest and target.exists() and target.stat().st_mtime >= changed_s:
            skipped += 1
        else:
            tmp = out / f".{name}.parquet.tmp"
            scan = SegmentScan(seg)
            with pq.ParquetWriter(tmp, LOG_SCHEMA, compression="zstd") as writer:
                for batch in scan:
                    writer.write_batch(batch)
            os.replace(tmp, target)
            files += 1
            records += scan.records
            corrupt += scan.corrupt
        if on_segment is not None:
            on_segment(name, n, len(segments))
    return ExportResult(files, skipped, records, corrupt)
