"""`txbroker bench recovery`: how long reopening takes after kill -9 with a large log.

A child process fills a store (async flush, 1 KiB messages) to the requested size and keeps
appending; the parent kills it with SIGKILL mid-append and times the reopen. It then removes
the checkpoint and times the worst case, a verify-and-replay of the whole log.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from txbroker.store import FlushMode, MessageStore, StoreConfig
from txbroker.store.checkpoint import CHECKPOINT_FILE

_CHILD = """
import asyncio, os, sys
from pathlib import Path
from txbroker.store import FlushMode, Message, MessageStore, StoreConfig

async def main(path, target):
    store = await MessageStore.open(StoreConfig(Path(path), flush=FlushMode.ASYNC))
    body = os.urandom(1024)
    announced = False
    i = 0
    while True:
        store.append_nowait(Message("bench", body, queue_id=i % 8, properties={"keys": f"k{i}"}))
        i += 1
        if i % 4096 == 0:
            await asyncio.sleep(0)
            if not announced and store.write_offset >= target:
                os.write(1, b"FILLED\\n")
                announced = True

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@dataclass(frozen=True)
class RecoveryBenchResult:
    log_bytes: int
    records: int
    reopen_after_kill_s: float
    replayed_after_kill: int
    full_replay_s: float
    replayed_full: int


async def _time_open(path: Path) -> tuple[float, int, int, int]:
    t0 = time.perf_counter()
    store = await MessageStore.open(StoreConfig(path, flush=FlushMode.ASYNC))
    elapsed = time.perf_counter() - t0
    rep = store.recovery
    assert rep is not None
    records = sum(store.queue_range("bench", q)[1] for q in range(8))
    size = store.write_offset - store.log.min_offset
    await store.close()
    return elapsed, rep.records_replayed, records, size


def _fill_and_kill(path: Path, log_bytes: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(log_bytes)], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # returns once the child has written log_bytes
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    if line.strip() != b"FILLED":
        raise RuntimeError("the filling process died before reaching the target size")


async def bench_recovery(log_bytes: int, data_root: Path | None = None) -> RecoveryBenchResult:
    root = Path(tempfile.mkdtemp(prefix="txb-recovery-", dir=data_root))
    try:
        path = root / "store"
        await asyncio.to_thread(_fill_and_kill, path, log_bytes)
        after_kill, replayed, records, size = await _time_open(path)
        os.unlink(path / CHECKPOINT_FILE)
        (path / "abort").touch()
        full, replayed_full, _, _ = await _time_open(path)
        return RecoveryBenchResult(
            size, records, round(after_kill, 2), replayed, round(full, 2), replayed_full
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_recovery(res: RecoveryBenchResult) -> str:
    return (
        f"recovery bench: log {res.log_bytes / 2**20:,.0f} MiB, {res.records:,} records\n"
        f"  reopen after kill -9       {res.reopen_after_kill_s:6.2f} s"
        f"  ({res.replayed_after_kill:,} records replayed from the checkpoint)\n"
        f"  reopen with no checkpoint  {res.full_replay_s:6.2f} s"
        f"  ({res.replayed_full:,} records verified and replayed)"
    )
