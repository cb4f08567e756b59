"""The store's side of replication in one process: a master store's flushed bytes copied into a
replica store at the same offsets (``read_replicated`` / ``append_replicated``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.conftest import OpenStore, small_config
from txbroker.errors import CorruptLog, InvalidOffset, NotMaster
from txbroker.store import KeyKind, Message, MessageStore, RecordFlag


async def _copy(master: MessageStore, replica: MessageStore, max_bytes: int = 64 * 1024) -> int:
    """Copy until the replica has everything the master flushed; returns the fetches made."""
    fetches = 0
    while replica.write_offset < master.flushed_offset:
        data, nxt = master.read_replicated(replica.write_offset, max_bytes)
        replica.append_replicated(replica.write_offset, data, nxt)
        await replica.committer.wait_durable()
        fetches += 1
    return fetches


def _log_bytes(store_dir: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted((store_dir / "commitlog").iterdir()):
        raw = p.read_bytes()
        if raw.count(0) != len(raw):
            out[p.name] = raw
    return out


async def test_replica_rolls_segments_and_indexes_like_the_master(
    open_store: OpenStore, tmp_path: Path
) -> None:
    master = await open_store(tmp_path / "m")
    replica = await open_store(tmp_path / "r")
    replica.follow("txb://master:1")
    for i in range(120):  # 120 x 4 KiB: past one 256 KiB segment
        flags = RecordFlag.TX_HALF if i % 10 == 0 else 0
        props = {"keys": f"k{i}", "tags": "even" if i % 2 == 0 else "odd"}
        await master.append(Message("orders", bytes(4096), i % 3, props, flags))
    assert await _copy(master, replica) > 1
    assert replica.write_offset == master.write_offset
    for qid in range(3):
        want = await master.get_messages("orders", qid, 0, max_count=100)
        got = await replica.get_messages("orders", qid, 0, max_count=100)
        assert [m.physical_offset for m in got.messages] == [
            m.physical_offset for m in want.messages
        ]
    even = await replica.get_messages("orders", 0, 0, max_count=100, tags=["even"])
    assert even.messages and all(m.tags == "even" for m in even.messages)
    assert await replica.lookup(KeyKind.KEY, "k7")
    assert not await replica.lookup(KeyKind.KEY, "k10")  # half messages are not indexed
    with pytest.raises(NotMaster, match="txb://master:1"):
        await replica.append(Message("orders", b"mine"))
    await master.close()
    await replica.close()
    assert len(_log_bytes(tmp_path / "m")) == 2
    assert _log_bytes(tmp_path / "m") == _log_bytes(tmp_path / "r")
    # A restart is an ordinary recovery: the replica's queues come back as they were.
    again = await MessageStore.open(small_config(tmp_path / "r"))
    try:
        got = await again.get_messages("orders", 1, 0, max_count=100)
        assert len(got.messages) == 40
    finally:
        await again.close()


async def test_bad_bytes_are_refused_before_anything_is_written(
    open_store: OpenStore, tmp_path: Path
) -> None:
    master = await open_store(tmp_path / "m")
    replica = await open_store(tmp_path / "r")
    for i in range(3):
        await master.append(Message("t", f"body {i}".encode()))
    data, nxt = master.read_replicated(0, 1 << 20)
    broken = bytearray(data)
    broken[-1] ^= 0xFF  # the last record's body: its CRC no longer matches
    with pytest.raises(CorruptLog, match="CRC"):
        replica.append_replicated(0, bytes(broken), nxt)
    assert replica.write_offset == 0 and not replica.queues
    with pytest.raises(InvalidOffset):
        replica.append_replicated(5, data, nxt)  # not where the replica's log ends
    with pytest.raises(InvalidOffset, match="past this master's end"):
        master.read_replicated(master.write_offset + 100, 1 << 20)
    replica.append_replicated(0, data, nxt)
    assert replica.write_offset == master.write_offset


async def test_only_flushed_bytes_are_served(open_store: OpenStore, tmp_path: Path) -> None:
    master = await open_store(tmp_path / "m")
    master.append_nowait(Message("t", b"not yet flushed"))
    assert master.read_replicated(0, 1 << 20) == (b"", 0)
    durable = master.durable()
    assert durable is not None
    await asyncio.wait_for(durable, 10)
    data, nxt = master.read_replicated(0, 1 << 20)
    assert len(data) == nxt == master.flushed_offset > 0
