"""Reading a running broker's log (`--log` on its data directory): what is read while the broker
appends is always a prefix of what it ends up holding, damage only ever at the end of the
segment being written and said so; the job runs clean beside it; a segment that retention
deleted after the job listed it stops the job with exit code 2 and what to do, not a crash."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerProcess, small_config
from tests.reconcile.conftest import run_async
from txbroker.store import Message, MessageStore
from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.extract import keep_log
from txbroker_reconcile.logsource import FORMAT
from txbroker_reconcile.run import main
from txbroker_reconcile.segments import GONE, SegmentScan, find_segments
from txbroker_reconcile.state import State
from txbroker_sdk import Client

TAIL = "at the end of the segment being written"


def _scan(data_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for seg in find_segments(data_dir):
        for batch in SegmentScan(seg):
            rows.extend({**r, "newest": seg.newest} for r in batch.to_pylist())
    return rows


def _valid(rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(r["position"], r["keys"]) for r in rows if r["corrupt"] is None]


def test_reads_of_a_log_being_written_are_prefixes_of_it(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    scans: list[list[dict[str, Any]]] = []
    sent: set[str] = set()
    try:

        async def traffic() -> None:
            async with await Client.connect(broker.url) as client:
                await client.create_topic("live", exist_ok=True)
                for n in range(0, 6_000, 50):
                    batch = [f"k{i:06d}" for i in range(n, n + 50)]
                    await asyncio.gather(*(client.send("live", b"x" * 200, key=k) for k in batch))
                    sent.update(batch)

        def read(stop: threading.Event) -> None:
            while not stop.is_set():
                scans.append(_scan(broker.data_dir))

        stop = threading.Event()
        reader = threading.Thread(target=read, args=(stop,))
        reader.start()
        try:
            run_async(traffic())
        finally:
            stop.set()
            reader.join(timeout=60)
        final = _scan(broker.data_dir)
    finally:
        broker.stop()
    assert len(scans) >= 5, "the reader should have read the log several times meanwhile"
    whole = _valid(final)
    assert [r for r in final if r["corrupt"]] == []
    assert sorted(k for _p, k in whole if k and k.startswith("k")) == sorted(sent)
    grew = False
    for rows in scans:
        valid = _valid(rows)
        assert valid == whole[: len(valid)]  # every record read then is there, unchanged
        grew |= 0 < len(valid) < len(whole)
        bad = [r for r in rows if r["corrupt"]]
        # A record caught half-written: the last row read, of the file being written.
        assert all(r is rows[-1] and r["newest"] and TAIL in r["corrupt"] for r in bad), bad
    assert grew, "no read landed while the broker was still writing"


def test_the_job_runs_clean_beside_a_running_broker(
    spark: Any, tmp_path: Path, service_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = BrokerProcess(tmp_path / "broker").start()
    try:

        async def send(n: int) -> None:
            async with await Client.connect(broker.url) as client:
                await client.create_topic("live", exist_ok=True)
                for i in range(0, n, 25):
                    await asyncio.gather(
                        *(client.send("live", b"y", key=f"k{j}") for j in range(i, i + 25))
                    )

        run_async(send(200))
        done = threading.Event()
        more = threading.Thread(target=lambda: (run_async(send(2_000)), done.set()))
        more.start()
        try:
            out = tmp_path / "out"
            args = ["--service", f"svc={service_db}", "--log", str(broker.data_dir)]
            code = main([*args, "--out", str(out), "--json", "--grace", "0s"])
        finally:
            more.join(timeout=120)
    finally:
        broker.stop()
    assert done.is_set()
    summary = json.loads((out / "summary.json").read_text())
    assert code == 0, summary["by_reason"]
    assert summary["inputs"]["log"]["records"] >= 200
    tail = [c for c in summary["corrupt"] if TAIL not in c["reason"]]
    assert tail == []  # damage read meanwhile can only be the record being written
    capsys.readouterr()


async def _write(data_dir: Path) -> None:
    store = await MessageStore.open(small_config(data_dir))  # 256 KiB segments
    try:
        await store.append_batch([Message("t", b"z" * 500, 0, {}) for _ in range(2_000)])
    finally:
        await store.close()


def test_a_segment_deleted_after_it_was_listed_is_cannot_run(spark: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    asyncio.run(_write(data_dir))
    listed = find_segments(data_dir)
    assert len(listed) > 3
    # What the broker's retention does to its oldest segment: unlink it (store/retention.py).
    Path(listed[0].path).unlink()
    df = (
        spark.read.format(FORMAT)
        .option("segments", json.dumps([[s.path, s.newest] for s in listed]))
        .load(str(data_dir))
    )
    with pytest.raises(CannotRun) as e:
        keep_log(State(tmp_path / "state"), df)
    assert str(e.value) == (
        f"segment {listed[0].path} {GONE} (the broker's retention deletes its oldest segments "
        "while it runs): run the job again"
    )
    # Read without Spark (`txbroker log export`), the same.
    with pytest.raises(CannotRun, match="run the job again"):
        list(SegmentScan(listed[0]))
    # A file deleted once open is read to its end: Linux keeps it while it is mapped.
    scan = iter(SegmentScan(listed[1], batch_rows=10))
    assert next(scan).num_rows == 10
    Path(listed[1].path).unlink()
    assert sum(b.num_rows for b in scan) > 10
