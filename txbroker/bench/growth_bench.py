"""`txbroker bench growth`: what a broker costs in memory and start-up time as data grows.

For each size, a store is filled in-process with that many messages (the point is the cost of
*having* the data, not of receiving it: that is `txbroker bench produce`), a real broker process
is started on it, and its start-up time and memory are read; then consumer-group offsets are
added and it is started again. Memory is reported as the kernel splits it: ``RssAnon`` is the
process's own heap, ``RssFile`` the pages of mapped store files it touched (page cache the
kernel may drop). :func:`bench_growth` gives the details.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from txbroker.runtime.brokerproc import BrokerProcess
from txbroker.server.groups import GroupCoordinator
from txbroker.store import FlushMode, Message, MessageStore, StoreConfig
from txbroker.store.record import PROP_KEYS, PROP_MESSAGE_ID

__all__ = ["GrowthPoint", "bench_growth", "format_growth"]

TOPIC = "bench"
QUEUES = 8
BODY_BYTES = 1024


@dataclass(frozen=True)
class GrowthPoint:
    messages: int
    groups: int
    log_bytes: int  # written, not the preallocated segment files
    index_bytes: int  # the index files' size (preallocated)
    start_s: float
    rss_mib: float
    rss_anon_mib: float
    rss_file_mib: float


def _status_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(value.split()[0])
    return out


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _measure(data: Path, messages: int, groups: int, log_bytes: int) -> GrowthPoint:
    t0 = time.perf_counter()
    b = BrokerProcess(data).start()
    started = time.perf_counter() - t0
    try:
        assert b.proc is not None
        kib = _status_kib(b.proc.pid)
    finally:
        b.stop()
    return GrowthPoint(
        messages,
        groups,
        log_bytes,
        _dir_bytes(data / "store" / "index"),
        round(started, 2),
        round(kib["VmRSS"] / 1024, 1),
        round(kib.get("RssAnon", 0) / 1024, 1),
        round(kib.get("RssFile", 0) / 1024, 1),
    )


async def _fill(data: Path, start: int, end: int, say: Callable[[str], None]) -> int:
    """Append messages start..end-1; returns the bytes the log holds."""
    store = await MessageStore.open(StoreConfig(data / "store", flush=FlushMode.ASYNC))
    try:
        body = os.urandom(BODY_BYTES)
        step = max((end - start) // 10, 1)
        for i in range(start, end):
            props = {PROP_MESSAGE_ID: f"{i:032x}", PROP_KEYS: f"order-{i}"}
            store.append_nowait(Message(TOPIC, body, queue_id=i % QUEUES, properties=props))
            if i % 4096 == 0:
                await asyncio.sleep(0)  # let the group commit run
            if (i - start) % step == 0 and i > start:
                say(f"  {i:,} messages stored")
        return store.write_offset - store.log.min_offset
    finally:
        await store.close()


def _add_groups(data: Path, groups: int) -> None:
    coordinator = GroupCoordinator(data / "meta")
    coordinator.load()
    for g in range(groups):
        for q in range(QUEUES):
            coordinator.commit(f"group-{g}", TOPIC, q, q)
    coordinator.snapshot.save()


async def bench_growth(
    sizes: list[int],
    groups: int,
    data_root: Path | None = None,
    say: Callable[[str], None] = lambda _s: None,
) -> list[GrowthPoint]:
    """One point per size (ascending, the store grows from one to the next), then the largest
    size again with ``groups`` groups' offsets; a point with no data first, as the baseline.

    The messages are 1 KiB, on 8 queues of one topic, each with a message id and a business key,
    as the SDK sends them (two key-index entries per message: what a send indexes). The start-up
    is timed from spawn to the ready line, and memory read from /proc once the broker is ready.
    The groups' offsets cover every queue of the topic each. ``RssAnon`` is what grows if the
    broker holds anything per message in Python objects."""
    root = Path(tempfile.mkdtemp(prefix="txb-growth-", dir=data_root))
    data = root / "broker"
    points: list[GrowthPoint] = []
    try:
        b = BrokerProcess(data).start()  # creates the topic the way a user does
        try:
            from txbroker_sdk import Client

            async with await Client.connect(b.url) as c:
                await c.create_topic(TOPIC, queues=QUEUES)
        finally:
            b.stop()
        points.append(await asyncio.to_thread(_measure, data, 0, 0, 0))
        stored = log_bytes = 0
        for n in sorted(sizes):
            say(f"filling the store to {n:,} messages ...")
            log_bytes = await _fill(data, stored, n, say)
            stored = n
            say(f"starting a broker on {n:,} messages ...")
            points.append(await asyncio.to_thread(_measure, data, n, 0, log_bytes))
        if groups:
            say(f"adding {groups:,} consumer groups' offsets ...")
            await asyncio.to_thread(_add_groups, data, groups)
            points.append(await asyncio.to_thread(_measure, data, stored, groups, log_bytes))
        return points
    finally:
        shutil.rmtree(root, ignore_errors=True)


def per_message_bytes(points: list[GrowthPoint]) -> float | None:
    """Heap growth per stored message between the smallest and largest filled store."""
    filled = [p for p in points if p.messages and not p.groups]
    if len(filled) < 2 or filled[-1].messages == filled[0].messages:
        return None
    grew = (filled[-1].rss_anon_mib - filled[0].rss_anon_mib) * 2**20
    return grew / (filled[-1].messages - filled[0].messages)


def format_growth(points: list[GrowthPoint]) -> str:
    rows = [
        "growth bench: a broker started on a filled store (1 KiB messages, 8 queues)",
        f"  {'messages':>12} {'groups':>8} {'log GiB':>8} {'index MiB':>10} {'start s':>8}"
        f" {'RSS MiB':>8} {'anon MiB':>9} {'file MiB':>9}",
    ]
    for p in points:
        rows.append(
            f"  {p.messages:>12,} {p.groups:>8,} {p.log_bytes / 2**30:>8.2f}"
            f" {p.index_bytes / 2**20:>10.1f} {p.start_s:>8.2f} {p.rss_mib:>8.1f}"
            f" {p.rss_anon_mib:>9.1f} {p.rss_file_mib:>9.1f}"
        )
    per = per_message_bytes(points)
    if per is not None:
        rows.append(f"  heap growth per stored message: {per:.2f} bytes")
    return "\n".join(rows)
