"""Retention asks its hook before deleting: the hook sees where the log will start while the
doomed records are still readable, what it copies forward survives, only the segments planned
before it ran go, and a hook that fails keeps every segment."""

from __future__ import annotations

import pytest

from tests.conftest import OpenStore
from txbroker.errors import Internal
from txbroker.store import Message, MessageStore


class Keeper:
    """Copies the record at ``keep`` forward when retention is about to delete it."""

    def __init__(self, store: MessageStore, keep: int) -> None:
        self.store = store
        self.keep = keep
        self.calls: list[int] = []
        self.fail = False
        self.copy_at: int | None = None

    async def before_retention(self, log_start: int) -> None:
        self.calls.append(log_start)
        if self.fail:
            raise Internal("not now")
        if self.keep < log_start:
            old = await self.store.read(self.keep)  # still there while the hook runs
            res = await self.store.append(Message("keep", old.body, 0, {"copied": "1"}))
            self.keep = self.copy_at = res.physical_offset


async def _fill(store: MessageStore, n: int) -> None:
    for i in range(n):
        await store.append(Message("filler", str(i).encode() + b"z" * 50_000))


async def test_the_hook_copies_forward_before_the_segments_go(open_store: OpenStore) -> None:
    store = await open_store(retention_bytes=512 * 1024, retention_ms=None)
    first = await store.append(Message("keep", b"precious"))
    await _fill(store, 40)
    keeper = Keeper(store, first.physical_offset)
    store.retention_hook = keeper
    segments = len(store.log.segments)
    rep = await store.enforce_retention()
    assert len(keeper.calls) == 1 and keeper.calls[0] == rep.log_min_offset
    assert rep.segments_deleted > 0 and store.log.min_offset > first.physical_offset
    # Only what was planned went: the copy lengthened the log, the next round weighs that.
    assert len(store.log.segments) == segments - rep.segments_deleted
    assert keeper.copy_at is not None
    assert (await store.read(keeper.copy_at)).body == b"precious"
    assert await store.enforce_retention() == type(rep)(0, 0, store.log.min_offset)
    assert len(keeper.calls) == 1  # nothing due: the hook is not asked


async def test_a_failing_hook_keeps_every_segment(open_store: OpenStore) -> None:
    store = await open_store(retention_bytes=512 * 1024, retention_ms=None)
    first = await store.append(Message("keep", b"precious"))
    await _fill(store, 40)
    keeper = Keeper(store, first.physical_offset)
    keeper.fail = True
    store.retention_hook = keeper
    segments = len(store.log.segments)
    with pytest.raises(Internal):
        await store.enforce_retention()
    assert len(store.log.segments) == segments and store.log.min_offset == 0
    assert (await store.read(first.physical_offset)).body == b"precious"
    keeper.fail = False
    assert (await store.enforce_retention()).segments_deleted > 0  # the next round deletes
    assert keeper.calls[0] == keeper.calls[1]
