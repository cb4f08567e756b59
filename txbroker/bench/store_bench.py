"""`txbroker bench store`: append throughput and latency of the message store, against the raw
ceiling of the same disk measured in the same run.

The raw ceiling is what the disk gives a program that does nothing but write the same bytes
sequentially and fdatasync at the same batch sizes the store achieved (sync mode), or write them
with no fsync at all (async mode). The fraction of it the store reaches is the number to watch:
it is independent of how fast this particular machine's disk is today.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from txbroker.store import FlushMode, Message, MessageStore, StoreConfig


@dataclass(frozen=True)
class StoreBenchResult:
    flush: str
    messages: int
    size: int
    appenders: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    fsyncs: int
    records_per_fsync: float
    append_p50_us: float
    append_p99_us: float
    append_p999_us: float
    fsync_p50_us: float
    raw_msgs_per_s: float
    fraction_of_raw: float


def _pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


async def _run_store(
    data_dir: Path, messages: int, size: int, flush: FlushMode, appenders: int, queues: int
) -> tuple[float, list[float], MessageStore]:
    cfg = StoreConfig(data_dir, flush=flush, checkpoint_interval_ms=1000)
    store = await MessageStore.open(cfg)
    body = os.urandom(size)
    per = messages // appenders
    lat: list[float] = []
    # Warm-up excluded from latency: the first 2% of each appender's messages.
    warm = max(per // 50, 1)

    async def appender(n: int) -> None:
        msg = Message("bench", body, queue_id=n % queues)
        clock = time.perf_counter
        mine: list[float] = []
        for i in range(per):
            t = clock()
            await store.append(msg)
            if i >= warm:
                mine.append(clock() - t)
        lat.extend(mine)

    t0 = time.perf_counter()
    await asyncio.gather(*(appender(n) for n in range(appenders)))
    elapsed = time.perf_counter() - t0
    return elapsed, lat, store


def _raw_ceiling(data_dir: Path, total_bytes: int, batch_bytes: int, fsync: bool) -> float:
    """Seconds to write ``total_bytes`` sequentially in ``batch_bytes`` chunks, fdatasync after
    each chunk when ``fsync``: the disk's ceiling for the same work."""
    path = data_dir / "raw-ceiling.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    chunk = os.urandom(max(batch_bytes, 1))
    try:
        t0 = time.perf_counter()
        written = 0
        while written < total_bytes:
            written += os.write(fd, chunk)
            if fsync:
                os.fdatasync(fd)
        if not fsync:
            os.fdatasync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


async def bench_store(
    messages: int,
    size: int,
    flush: FlushMode,
    appenders: int,
    data_root: Path | None = None,
    queues: int = 8,
) -> StoreBenchResult:
    root = Path(tempfile.mkdtemp(prefix="txb-bench-", dir=data_root))
    try:
        elapsed, lat, store = await _run_store(
            root / "store", messages, size, flush, appenders, queues
        )
        c = store.committer
        fsyncs, recs = c.fsync_count, c.fsync_records
        fsync_times = sorted(c.fsync_seconds)
        record_bytes = (store.write_offset - 0) / max(messages // appenders * appenders, 1)
        await store.close()
        done = messages // appenders * appenders
        lat.sort()
        per_fsync = recs / fsyncs if fsyncs else 0.0
        if flush is FlushMode.SYNC:
            batch = max(int(per_fsync), 1)
            raw_s = _raw_ceiling(root, int(record_bytes * done), int(record_bytes * batch), True)
        else:
            raw_s = _raw_ceiling(
                root, int(record_bytes * done), int(record_bytes * appenders), False
            )
        raw_rate = done / raw_s
        rate = done / elapsed
        return StoreBenchResult(
            flush=flush.value,
            messages=done,
            size=size,
            appenders=appenders,
            seconds=round(elapsed, 3),
            msgs_per_s=round(rate),
            mb_per_s=round(rate * size / 1e6, 1),
            fsyncs=fsyncs,
            records_per_fsync=round(per_fsync, 1),
            append_p50_us=round(_pct(lat, 0.5) * 1e6, 1),
            append_p99_us=round(_pct(lat, 0.99) * 1e6, 1),
            append_p999_us=round(_pct(lat, 0.999) * 1e6, 1),
            fsync_p50_us=round(_pct(fsync_times, 0.5) * 1e6, 1),
            raw_msgs_per_s=round(raw_rate),
            fraction_of_raw=round(rate / raw_rate, 3),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def summarize(results: list[StoreBenchResult]) -> dict[str, object]:
    """Median of several runs, field by field, plus the runs themselves."""
    med = {
        k: statistics.median(getattr(r, k) for r in results)
        for k, v in asdict(results[0]).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    return {
        "flush": results[0].flush,
        "runs": len(results),
        "median": med,
        "all": [asdict(r) for r in results],
    }


def format_result(summary: dict[str, object]) -> str:
    m = summary["median"]
    assert isinstance(m, dict)
    lines = [
        f"store bench: flush={summary['flush']} messages={int(m['messages']):,} "
        f"size={int(m['size'])}B appenders={int(m['appenders'])} "
        f"(median of {summary['runs']} run(s))",
        f"  throughput      {m['msgs_per_s']:>12,.0f} msgs/s   {m['mb_per_s']:>8,.1f} MB/s",
        f"  append latency  p50 {m['append_p50_us']:,.0f} us   p99 {m['append_p99_us']:,.0f} us"
        f"   p999 {m['append_p999_us']:,.0f} us",
        f"  fsync           {int(m['fsyncs']):,} calls, {m['records_per_fsync']:.1f} records each,"
        f" p50 {m['fsync_p50_us']:,.0f} us",
        f"  raw ceiling     {m['raw_msgs_per_s']:>12,.0f} msgs/s   "
        f"(achieved {m['fraction_of_raw'] * 100:.0f}% of it)",
    ]
    return "\n".join(lines)


def bench_disk(
    batches: list[int],
    record_bytes: int,
    total: int,
    runs: int,
    data_root: Path | None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[int, float]:
    """The disk's own ceiling: records/s for plain sequential write + fdatasync per batch of
    ``batch`` records, median of ``runs``. What group commit at that batch size could reach.
    ``progress(done, total)`` hears of each measurement (before the first, and after each)."""
    root = Path(tempfile.mkdtemp(prefix="txb-disk-", dir=data_root))
    steps, done = len(batches) * runs, 0
    try:
        out: dict[int, float] = {}
        for batch in batches:
            rates = []
            for _ in range(runs):
                if progress is not None:
                    progress(done, steps)
                rates.append(
                    total / _raw_ceiling(root, total * record_bytes, batch * record_bytes, True)
                )
                done += 1
            out[batch] = round(statistics.median(rates))
        if progress is not None:
            progress(done, steps)
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_disk(res: dict[int, float]) -> str:
    return "\n".join(
        f"write+fdatasync every {batch:>4} records: {rate:>12,.0f} records/s"
        for batch, rate in res.items()
    )
