"""A failed append is all or nothing, with real faults: a file the append needs cannot be
created, a write fails, the group commit's syncer dies. What the caller was told failed is
neither counted nor readable, now or after a crash; what it was told succeeded is."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import small_config
from txbroker.errors import StoreFailed
from txbroker.store import FlushMode, KeyKind, Message, MessageStore, StoreState


async def _bodies(store: MessageStore, topic: str) -> list[bytes]:
    lo, _ = store.queue_range(topic, 0)
    return [m.body for m in (await store.get_messages(topic, 0, lo, 1000)).messages]


async def _reopened(data: Path, store: MessageStore) -> MessageStore:
    store.abandon()  # as kill -9 would leave it
    return await MessageStore.open(small_config(data))


async def test_a_batch_whose_queue_file_cannot_be_created_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "s"
    store = await MessageStore.open(small_config(data))
    await store.append_batch([Message("a", b"a0"), Message("a", b"a1")])
    end = store.write_offset
    # A file where topic b's queue directory must go: mkdir fails, for root too.
    (data / "consumequeue").mkdir(exist_ok=True)
    (data / "consumequeue" / "b").write_bytes(b"in the way")
    batch = [Message("a", b"a2"), Message("b", b"b0"), Message("a", b"a3")]
    with pytest.raises(StoreFailed, match="nothing was written"):
        await store.append_batch(batch)
    assert store.state is StoreState.OPEN
    assert store.write_offset == end and store.queue_range("a", 0) == (0, 2)
    assert await _bodies(store, "a") == [b"a0", b"a1"]
    (data / "consumequeue" / "b").unlink()  # the fault goes away: appending resumes
    res = await store.append_batch([Message("a", b"a4"), Message("b", b"b1")])
    assert [(r.topic, r.queue_offset) for r in res] == [("a", 2), ("b", 0)]
    store = await _reopened(data, store)
    try:
        assert await _bodies(store, "a") == [b"a0", b"a1", b"a4"]
        assert await _bodies(store, "b") == [b"b1"]
    finally:
        await store.close()


async def test_a_key_index_file_that_cannot_be_created_fails_the_append_cleanly(
    tmp_path: Path,
) -> None:
    data = tmp_path / "s"
    store = await MessageStore.open(small_config(data, index_capacity=10))
    for i in range(10):  # fills the first index file: the next append needs a new one
        await store.append(Message("t", f"m{i}".encode(), properties={"keys": f"k{i}"}))
    # A directory where that file goes (named by the next record's offset).
    blocker = data / "index" / f"{store.write_offset:020d}"
    blocker.mkdir()
    with pytest.raises(StoreFailed, match="nothing was written"):
        await store.append(Message("t", b"failed", properties={"keys": "kf"}))
    assert store.queue_range("t", 0) == (0, 10)  # not counted
    assert await store.lookup(KeyKind.KEY, "kf") == []
    blocker.rmdir()
    res = await store.append(Message("t", b"m10", properties={"keys": "k10"}))
    assert res.queue_offset == 10  # no hole where the failed one was
    store = await _reopened(data, store)
    try:
        assert await _bodies(store, "t") == [f"m{i}".encode() for i in range(11)]
        assert await store.lookup(KeyKind.KEY, "kf") == []
        assert [m.body for m in await store.lookup(KeyKind.KEY, "k10")] == [b"m10"]
    finally:
        await store.close()


async def test_a_failed_group_commit_never_delivers_what_it_failed(tmp_path: Path) -> None:
    """Sync flush: the records a dead syncer could not make durable were written to the file
    all the same (the group commit writes, then syncs). Their producers were told the append
    failed, so the next open must not bring them back."""
    data = tmp_path / "s"
    store = await MessageStore.open(small_config(data))
    acked = [await store.append(Message("t", f"ok{i}".encode())) for i in range(5)]
    proc = store.committer._proc
    proc.kill()  # the syncer process dies: no fdatasync will answer again
    await asyncio.to_thread(proc.wait, 10)
    outcomes = await asyncio.gather(
        *(store.append(Message("t", f"lost{i}".encode())) for i in range(5)),
        return_exceptions=True,
    )
    assert all(isinstance(o, StoreFailed) for o in outcomes), outcomes
    assert store.state is not StoreState.OPEN or store.committer.failure is not None
    assert (data / "cut").is_file()
    assert store.queue_range("t", 0) == (0, 5)  # what failed is not counted, even now
    assert await _bodies(store, "t") == [f"ok{i}".encode() for i in range(5)]
    store = await _reopened(data, store)
    try:
        assert await _bodies(store, "t") == [f"ok{i}".encode() for i in range(5)]
        assert not (data / "cut").is_file()  # applied once, durably
        assert (await store.append(Message("t", b"after"))).queue_offset == len(acked)
    finally:
        await store.close()


async def test_a_failed_store_closed_gracefully_never_delivers_what_it_failed(
    tmp_path: Path,
) -> None:
    """As the previous test, but the store is closed as the broker's stop closes it, before
    any later append noticed the failure: that close must not write a checkpoint past the cut
    (the next open would then ignore the cut and keep the failed records' queue entries)."""
    data = tmp_path / "s"
    store = await MessageStore.open(small_config(data))
    for i in range(5):
        await store.append(Message("t", f"ok{i}".encode()))
    for i in range(5):  # accepted, not yet durable: their group commit is still to start
        store.append_nowait(Message("t", f"lost{i}".encode()))
    proc = store.committer._proc
    proc.kill()
    await asyncio.to_thread(proc.wait, 10)
    durable = store.durable()
    assert durable is not None
    with pytest.raises(StoreFailed):
        await durable  # the group wrote them to the file, then could not sync them
    assert store.state is StoreState.FAILED  # at once, not at the next append
    await store.close()
    store = await MessageStore.open(small_config(data))
    try:
        assert await _bodies(store, "t") == [f"ok{i}".encode() for i in range(5)]
        assert store.queue_range("t", 0) == (0, 5)
    finally:
        await store.close()


_ROOT = Path(__file__).resolve().parents[2]
_CHILD = """
import asyncio, resource, sys
from pathlib import Path
from tests.conftest import small_config
from txbroker.errors import StoreFailed
from txbroker.store import Message, MessageStore

async def main(data, extra):
    store = await MessageStore.open(small_config(Path(data)))
    for i in range(20):
        await store.append(Message("t", b"x" * 1000))
    size = store.write_offset // 20
    limit = store.write_offset + 5 * size + extra  # a record boundary, or inside a record
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    acked = 20
    try:
        for i in range(20):
            await store.append(Message("t", b"x" * 1000))
            acked += 1
    except StoreFailed:
        pass
    await store.close()
    print(acked)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


@pytest.mark.skipif(not hasattr(resource, "RLIMIT_FSIZE"), reason="no RLIMIT_FSIZE")
@pytest.mark.parametrize("extra", [0, 500], ids=["at-a-record-boundary", "inside-a-record"])
async def test_a_write_failing_at_a_file_size_limit_leaves_every_queue_entry_readable(
    tmp_path: Path, extra: int
) -> None:
    """The chaos campaign's --disk rlimit at the store level: RLIMIT_FSIZE cuts the log's
    writes short (a pwrite across the limit writes part and returns no error) or fails them
    (EFBIG). Every append acknowledged is read back after a restart, and no queue entry points
    at the cut or into what was never written."""
    data = tmp_path / "s"
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", _CHILD, str(data), str(extra)],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    acked = int(out.stdout.split()[-1])
    assert 20 < acked < 40
    store = await MessageStore.open(small_config(data))
    try:
        await store.append(Message("other", b"after the restart"))  # the log grows again
        lo, hi = store.queue_range("t", 0)
        assert (lo, hi) == (0, acked)
        for off in range(lo, hi):
            got = await store.get_messages("t", 0, off, 1)
            assert [m.body for m in got.messages] == [b"x" * 1000]
    finally:
        await store.close()


@pytest.mark.parametrize("fault", ["pwrite-fails-mid-batch", "syncer-dies"])
async def test_a_failed_append_is_not_found_by_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    """The records of a failed append were indexed as they were written, before the write
    failed and the log was cut back: a lookup by their keys must not find them, now or after a
    restart (an idempotency check would otherwise answer "already stored" for a message whose
    producer was told it failed)."""
    data = tmp_path / "s"
    flush = FlushMode.ASYNC if fault == "pwrite-fails-mid-batch" else FlushMode.SYNC
    store = await MessageStore.open(small_config(data, flush=flush))
    kept = await store.append(Message("t", b"kept", properties={"ik": "ik-kept", "keys": "k0"}))
    batch = [
        Message("t", f"lost{i}".encode(), properties={"ik": f"ik-{i}", "keys": f"k{i + 1}"})
        for i in range(3)
    ]
    if fault == "pwrite-fails-mid-batch":
        real, calls = os.pwrite, 0

        def pwrite(fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
            nonlocal calls
            calls += 1
            if calls > 1:  # the batch's first record is written, the second meets a full disk
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
        with pytest.raises(StoreFailed):
            await store.append_batch(batch)
        monkeypatch.undo()
    else:
        store.append_batch_nowait(batch)  # accepted; their group commit is still to start
        proc = store.committer._proc
        proc.kill()  # the group commit writes the batch to the file, then cannot sync it
        await asyncio.to_thread(proc.wait, 10)
        durable = store.durable()
        assert durable is not None
        with pytest.raises(StoreFailed):
            await durable
    assert store.state is StoreState.FAILED

    async def found(kind: KeyKind, key: str) -> list[bytes]:
        return [m.body for m in await store.lookup(kind, key)]

    for i in range(3):
        assert await found(KeyKind.IDEMPOTENCY_KEY, f"ik-{i}") == []
        assert await found(KeyKind.KEY, f"k{i + 1}") == []
    assert await found(KeyKind.IDEMPOTENCY_KEY, "ik-kept") == [b"kept"]
    assert await found(KeyKind.MESSAGE_ID, kept.message_id) == [b"kept"]
    store = await _reopened(data, store)
    try:
        for i in range(3):
            assert await found(KeyKind.IDEMPOTENCY_KEY, f"ik-{i}") == []
        assert await found(KeyKind.KEY, "k0") == [b"kept"]
    finally:
        await store.close()
