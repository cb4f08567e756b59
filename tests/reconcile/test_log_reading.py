"""Reading the commit log without the broker: every record of real segment files, a damaged
record reported and stepped over (never fatal), the broker's unfinished tail left for the next
run, and the Parquet export read by the job like the segments themselves."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import small_config
from txbroker.store import Message, MessageStore
from txbroker.store.record import HEADER
from txbroker_reconcile.export import export_log
from txbroker_reconcile.run import main
from txbroker_reconcile.segments import SegmentScan, find_segments

N = 3000


async def _write(data_dir: Path) -> list[int]:
    """N records over several 256 KiB segments; returns their physical offsets."""
    store = await MessageStore.open(small_config(data_dir, segment_bytes=256 * 1024))
    try:
        results = await store.append_batch(
            [
                Message("orders", f"body {i}".encode() * 20, i % 3, {"id": f"m{i:05d}"})
                for i in range(N)
            ]
        )
    finally:
        await store.close()
    return [r.physical_offset for r in results]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    d = tmp_path_factory.mktemp("log")
    return d, asyncio.run(_write(d))


def _scan_all(d: Path) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    corrupt = 0
    for seg in find_segments(d):
        scan = SegmentScan(seg)
        for batch in scan:
            rows.extend(batch.to_pylist())
        corrupt += scan.corrupt
    return rows, corrupt


def test_every_record_is_read_with_its_fields(log_dir: tuple[Path, list[int]]) -> None:
    d, offsets = log_dir
    assert len(find_segments(d)) > 3  # the records span several segment files
    rows, corrupt = _scan_all(d)
    assert corrupt == 0
    assert [r["position"] for r in rows] == offsets
    assert [r["message_id"] for r in rows] == [f"m{i:05d}" for i in range(N)]
    assert {r["topic"] for r in rows} == {"orders"}
    assert [r["queue_id"] for r in rows[:4]] == [0, 1, 2, 0]


def _damaged_copy(src: Path, dst: Path, record: int, delta: int) -> Path:
    """A copy of the log ``src`` with one byte flipped, ``delta`` bytes into the record at
    physical offset ``record``."""
    shutil.copytree(src, dst)
    seg = next(s for s in reversed(find_segments(dst)) if s.base <= record)
    with open(seg.path, "r+b") as f:
        f.seek(record - seg.base + delta)
        byte = f.read(1)
        f.seek(record - seg.base + delta)
        f.write(bytes([byte[0] ^ 0xFF]))
    return dst


def test_a_corrupt_byte_is_one_corrupt_record_and_the_rest_is_read(
    log_dir: tuple[Path, list[int]], tmp_path: Path
) -> None:
    src, offsets = log_dir
    victim = offsets[N // 3]
    # inside the record's topic/properties: the CRC fails
    d = _damaged_copy(src, tmp_path / "log", victim, HEADER.size + 10)
    rows, corrupt = _scan_all(d)
    assert corrupt == 1
    bad = [r for r in rows if r["corrupt"] is not None]
    assert [r["position"] for r in bad] == [victim] and "CRC" in bad[0]["corrupt"]
    assert [r["position"] for r in rows if r["corrupt"] is None] == [
        o for o in offsets if o != victim
    ]


def test_a_torn_tail_of_the_newest_segment_is_left_for_later(
    log_dir: tuple[Path, list[int]], tmp_path: Path
) -> None:
    src, offsets = log_dir
    last = offsets[-1]
    # the record being written when the log was read
    d = _damaged_copy(src, tmp_path / "log", last, HEADER.size + 3)
    newest = [s for s in find_segments(d) if s.base <= last][-1]
    assert newest.newest  # the file being written (the next one is created early, empty)
    scan = SegmentScan(newest)
    rows = [r for b in scan for r in b.to_pylist()]
    assert rows[-1]["position"] == last and rows[-1]["corrupt"] is not None
    assert scan.end == last - newest.base  # the next incremental run reads it again


def test_reconcile_reports_corrupt_records_and_reads_the_export_alike(
    spark: Any,
    log_dir: tuple[Path, list[int]],
    tmp_path: Path,
    service_db: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, offsets = log_dir
    d = _damaged_copy(src, tmp_path / "log", offsets[10], HEADER.size + 10)
    db = service_db
    exported = export_log(d, tmp_path / "export")
    assert (exported.records, exported.corrupt) == (N - 1, 1)
    for log in (d, tmp_path / "export"):
        out = tmp_path / f"out-{log.name}"
        code = main(["--service", f"svc={db}", "--log", str(log), "--out", str(out), "--json"])
        assert code == 0  # a damaged record is reported, it is not an anomaly of the promise
        summary = json.loads((out / "summary.json").read_text())
        assert summary["inputs"]["log"]["records"] == N - 1
        assert summary["inputs"]["log"]["corrupt"] == 1
        assert summary["corrupt"][0]["position"] == offsets[10]
    capsys.readouterr()
