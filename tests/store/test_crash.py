"""Kill -9 while appending with sync flush: every acknowledged record survives byte-identical,
and recovery exposes nothing past the truncation point."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import small_config
from tests.store._appender import body_for
from txbroker.store import KeyKind, MessageStore
from txbroker.store.checkpoint import read_checkpoint
from txbroker.store.consumequeue import CQ_ENTRY
from txbroker.store.keyindex import INDEX_ENTRY, INDEX_HEADER, SLOT

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 20


def _run_child_until_killed(
    data: Path, first: int, acks_before_kill: int, *overrides: str
) -> list[tuple[int, ...]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.store._appender", str(data), str(first), *overrides],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + 60
    killed = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the appender made no progress within 60 s"
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            buf += chunk
            if not killed and buf.count(b"\n") > acks_before_kill:
                proc.send_signal(signal.SIGKILL)
                killed = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err
    lines = buf.split(b"\n")
    assert lines[0] == b"READY", err
    # The last line may be cut by the kill; a cut line was never fully reported, so skip it.
    return [tuple(int(x) for x in ln.split()) for ln in lines[1:-1]]


@pytest.mark.slow
async def test_sigkill_during_sync_appends_loses_no_acknowledged_record(tmp_path: Path) -> None:
    data = tmp_path / "store"
    rng = random.Random(20261121)
    acked: dict[int, tuple[int, int, int]] = {}
    for rnd in range(ROUNDS):
        acks = _run_child_until_killed(data, rnd * 1_000_000, rng.randint(1, 1500))
        assert acks, "the child was killed before acknowledging anything"
        for seq, qid, qoff, phys in acks:
            acked[seq] = (qid, qoff, phys)

        store = await MessageStore.open(small_config(data, segment_bytes=1024 * 1024))
        try:
            rep = store.recovery
            assert rep is not None and rep.abnormal
            end = store.write_offset
            assert end == rep.end_offset
            # 1. Every acknowledged record reads back byte-identical, where it was reported.
            for seq, (qid, qoff, phys) in acked.items():
                msg = await store.read(phys)
                assert msg.body == body_for(seq) and (msg.queue_id, msg.queue_offset) == (qid, qoff)
            # 2. Queues are dense and every entry is a whole, valid record before the end.
            seen = 0
            for qid in range(4):
                lo, hi = store.queue_range("crash", qid)
                offset = lo
                while offset < hi:
                    got = await store.get_messages("crash", qid, offset, max_count=500)
                    for m in got.messages:
                        assert m.queue_offset == offset and m.physical_offset + m.size <= end
                        seq = int(m.properties["keys"][1:])
                        assert m.body == body_for(seq)
                        offset += 1
                        seen += 1
                    assert got.messages, "a queue entry below max_offset did not resolve"
            assert seen >= len(acked)
            # 3. Keys still find their records.
            for seq in rng.sample(sorted(acked), min(20, len(acked))):
                found = await store.lookup(KeyKind.KEY, f"s{seq}")
                assert [m.physical_offset for m in found] == [acked[seq][2]]
        finally:
            await store.close()


def _lose_what_was_not_flushed(data: Path, slots: int) -> None:
    """Leave the queue and index files as a power loss may after the checkpoint: entries past
    what it recorded as durable gone, the index's slots garbage, later index files never
    written. (A kill -9 alone keeps them: the page cache outlives the process.)"""
    cp = read_checkpoint(data)
    assert cp is not None
    rng = random.Random(cp.log_offset)
    for key, count in cp.queues.items():
        for path in (data / "consumequeue" / key).iterdir():
            base, size = int(path.name), path.stat().st_size
            keep = min(max(count - base, 0), size // CQ_ENTRY.size) * CQ_ENTRY.size
            with path.open("r+b") as f:
                f.seek(keep)
                f.write(bytes(size - keep))
    for path in (data / "index").iterdir():
        if int(path.name) > cp.index_base:
            path.write_bytes(bytes(path.stat().st_size))
        elif int(path.name) == cp.index_base:
            entries_at = INDEX_HEADER.size + slots * SLOT.size
            with path.open("r+b") as f:
                f.seek(INDEX_HEADER.size)
                f.write(rng.randbytes(slots * SLOT.size))
                f.seek(entries_at + cp.index_count * INDEX_ENTRY.size)
                f.write(rng.randbytes(path.stat().st_size - f.tell()))


@pytest.mark.slow
async def test_sigkill_with_queues_and_index_unflushed_recovers_them_from_the_log(
    tmp_path: Path,
) -> None:
    """Queues are flushed by frequent checkpoints, the key index by none after the open: what
    neither flushed is rebuilt from the log, so every acknowledged record is consumable at the
    queue offset it was acknowledged with and its key finds it."""
    data = tmp_path / "store"
    slots = small_config(data).index_slots
    lazy = ("checkpoint_interval_ms=20", "index_flush_interval_ms=600000")
    acked: dict[int, tuple[int, int, int]] = {}
    for rnd in range(3):
        for seq, qid, qoff, phys in _run_child_until_killed(data, rnd * 1_000_000, 3000, *lazy):
            acked[seq] = (qid, qoff, phys)
        cp = read_checkpoint(data)
        assert cp is not None
        # Checkpoints ran while appending, and the key index lagged behind them.
        assert cp.index_durable < cp.log_offset
        _lose_what_was_not_flushed(data, slots)

        store = await MessageStore.open(small_config(data, segment_bytes=1024 * 1024))
        try:
            rep = store.recovery
            assert rep is not None and rep.abnormal
            assert (rep.index_offset, rep.checkpoint_offset) == (
                cp.index_durable,
                cp.log_offset,
            )
            assert not rep.queues_rebuilt and not rep.index_rebuilt
            for seq, (qid, qoff, phys) in acked.items():
                got = await store.get_messages("crash", qid, qoff, max_count=1)
                assert [(m.physical_offset, m.body) for m in got.messages] == [
                    (phys, body_for(seq))
                ]
                found = await store.lookup(KeyKind.KEY, f"s{seq}")
                assert [m.physical_offset for m in found] == [phys]
        finally:
            await store.close()
