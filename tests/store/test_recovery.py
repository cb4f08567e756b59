"""Recovery on real files: torn tails at every byte, garbage, mid-log damage, and random
append / restart / crash sequences checked against a model."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import small_config
from txbroker.errors import CorruptLog
from txbroker.store import KeyKind, Message, MessageStore
from txbroker.store.checkpoint import ABORT_FILE, CHECKPOINT_FILE


async def _bodies(store: MessageStore, topic: str = "t", queue: int = 0) -> list[bytes]:
    got = await store.get_messages(topic, queue, 0, max_count=10_000)
    return [m.body for m in got.messages]


async def _prepare_torn_case(base: Path) -> tuple[int, int]:
    """A store with 5 records whose checkpoint lies before the 5th; returns where the 5th
    record starts and its size. Simulates a crash while the last record was being written."""
    store = await MessageStore.open(small_config(base))
    for i in range(4):
        await store.append(Message("t", f"record-{i}".encode() * 3, properties={"keys": f"k{i}"}))
    await store.close()
    shutil.copy(base / CHECKPOINT_FILE, base / "cp.saved")
    store = await MessageStore.open(small_config(base))
    last = await store.append(Message("t", b"the-last-one" * 4, properties={"keys": "k4"}))
    await store.close()
    shutil.copy(base / "cp.saved", base / CHECKPOINT_FILE)
    (base / ABORT_FILE).touch()
    return last.physical_offset, last.size


def _poke(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in a store file, as a crash or a bad disk would."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _segment0(base: Path) -> Path:
    return base / "commitlog" / f"{0:020d}"


async def test_torn_last_record_recovers_to_the_valid_prefix_at_every_cut(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    start, size = await _prepare_torn_case(pristine)
    for cut in range(size):  # keep `cut` bytes of the last record, lose the rest
        case = tmp_path / f"cut{cut}"
        shutil.copytree(pristine, case)
        _poke(_segment0(case), start + cut, bytes(size - cut))
        store = await MessageStore.open(small_config(case))
        try:
            rep = store.recovery
            assert rep is not None and rep.abnormal and rep.end_offset == start, cut
            assert await _bodies(store) == [f"record-{i}".encode() * 3 for i in range(4)]
            assert store.queue_range("t", 0) == (0, 4)
            assert await store.lookup(KeyKind.KEY, "k4") == []
            assert len(await store.lookup(KeyKind.KEY, "k3")) == 1
            # The log is writable again right where the valid prefix ends.
            again = await store.append(Message("t", b"after"))
            assert (again.physical_offset, again.queue_offset) == (start, 4)
        finally:
            await store.close()
        shutil.rmtree(case)


@pytest.mark.parametrize("garbage_len", [1, 7, 56, 300, 5000])
async def test_garbage_after_the_last_record_is_cleared(tmp_path: Path, garbage_len: int) -> None:
    base = tmp_path / "s"
    start, size = await _prepare_torn_case(base)
    end = start + size
    # Non-zero first: zeros after the last record are a segment's ordinary unwritten tail, not
    # garbage (a random single byte is zero once in 256 runs).
    _poke(_segment0(base), end, b"\xa5" + os.urandom(garbage_len - 1))
    store = await MessageStore.open(small_config(base))
    rep = store.recovery
    assert rep is not None and rep.end_offset == end and rep.torn_reason is not None
    assert len(await _bodies(store)) == 5
    await store.append(Message("t", b"next"))
    await store.close()
    # A clean reopen sees the five plus the new one; the garbage is gone for good.
    store = await MessageStore.open(small_config(base))
    assert (await _bodies(store))[-1] == b"next" and store.recovery.torn_reason is None  # type: ignore[union-attr]
    await store.close()


async def test_damage_with_valid_data_after_it_is_reported_not_truncated(tmp_path: Path) -> None:
    base = tmp_path / "s"
    store = await MessageStore.open(small_config(base))
    first = await store.append(Message("t", b"first record"))
    for i in range(10):
        await store.append(Message("t", f"later-{i}".encode()))
    await store.close()
    seg = _segment0(base)
    _poke(seg, first.physical_offset + 70, b"X")
    # Without a checkpoint and after a crash, recovery verifies the whole log.
    (base / CHECKPOINT_FILE).unlink()
    (base / ABORT_FILE).touch()
    with pytest.raises(CorruptLog, match="valid record follows"):
        await MessageStore.open(small_config(base))
    # Nothing was truncated: the damage and the records after it are still there.
    data = seg.read_bytes()
    assert data[first.physical_offset + 70 : first.physical_offset + 71] == b"X"
    assert b"later-9" in data


async def test_damage_before_the_checkpoint_is_caught_when_read(tmp_path: Path) -> None:
    base = tmp_path / "s"
    store = await MessageStore.open(small_config(base))
    first = await store.append(Message("t", b"first record"))
    await store.append(Message("t", b"second"))
    await store.close()
    _poke(_segment0(base), first.physical_offset + first.size - 1, b"?")
    store = await MessageStore.open(small_config(base))
    try:
        with pytest.raises(CorruptLog, match="CRC mismatch"):
            await store.read(first.physical_offset)
        with pytest.raises(CorruptLog):
            await store.get_messages("t", 0, 0)
        assert (await store.get_messages("t", 0, 1)).messages[0].body == b"second"
    finally:
        await store.close()


async def test_damage_between_the_index_checkpoint_and_p_opens_and_indexes_past_p(
    tmp_path: Path,
) -> None:
    """After a crash, the replay for the key index starts before P (the index is flushed less
    often than the queues). Damage it meets before P is not a torn tail: the store opens, keeps
    every record, fails the damaged one's read, and indexes the records past P."""
    base = tmp_path / "s"
    lazy = {"checkpoint_interval_ms": 600_000, "index_flush_interval_ms": 600_000}
    store = await MessageStore.open(small_config(base, **lazy))
    res = [
        await store.append(Message("t", f"record-{i}".encode(), properties={"keys": f"k{i}"}))
        for i in range(3)
    ]
    cp = await store.checkpoint(index=False)
    assert cp.index_durable < res[1].physical_offset < cp.log_offset
    res.append(await store.append(Message("t", b"record-3", properties={"keys": "k3"})))
    store.abandon()
    _poke(_segment0(base), res[1].physical_offset + res[1].size - 1, b"?")
    store = await MessageStore.open(small_config(base, **lazy))
    try:
        rep = store.recovery
        assert rep is not None and rep.abnormal and rep.end_offset == store.write_offset
        assert rep.index_offset == cp.index_durable and rep.checkpoint_offset == cp.log_offset
        assert store.queue_range("t", 0) == (0, 4)
        with pytest.raises(CorruptLog, match="CRC mismatch"):
            await store.read(res[1].physical_offset)
        for i in (0, 3):
            found = await store.lookup(KeyKind.KEY, f"k{i}")
            assert [m.physical_offset for m in found] == [res[i].physical_offset]
        # Between the damage and P the index could not be rebuilt (logged); the queue still
        # delivers those records.
        assert await store.lookup(KeyKind.KEY, "k2") == []
        assert (await store.get_messages("t", 0, 2)).messages[0].body == b"record-2"
    finally:
        await store.close()


# --- model-based: random operations, checked after every step -----------------------------

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 2), st.integers(0, 3000), st.booleans()),
        st.tuples(st.just("batch"), st.integers(1, 20)),
        st.just(("reopen",)),
        st.just(("crash",)),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_append_read_recover_sequences(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[object, ...]]
) -> None:
    asyncio.run(_run_model(tmp_path_factory.mktemp("model"), ops))


async def _run_model(base: Path, ops: list[tuple[object, ...]]) -> None:
    model: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    keyed: dict[str, bytes] = {}
    store = await MessageStore.open(small_config(base))
    n = 0
    try:
        for op in ops:
            if op[0] == "append":
                _, q, size, with_key = op
                assert isinstance(q, int) and isinstance(size, int)
                body = f"{n}:".encode() + os.urandom(size)
                props = {"keys": f"key{n}"} if with_key else {}
                await store.append(Message("m", body, queue_id=q, properties=props))
                model[q].append(body)
                if with_key:
                    keyed[f"key{n}"] = body
                n += 1
            elif op[0] == "batch":
                count = op[1]
                assert isinstance(count, int)
                msgs = [
                    Message("m", f"{n + i}:b".encode(), queue_id=(n + i) % 3) for i in range(count)
                ]
                await store.append_batch(msgs)
                for m in msgs:
                    model[m.queue_id].append(m.body)
                n += count
            elif op[0] == "reopen":
                await store.close()
                store = await MessageStore.open(small_config(base))
            else:  # crash: every append above was acknowledged, so all must survive
                store.abandon()
                store = await MessageStore.open(small_config(base))
                assert store.recovery is not None and store.recovery.abnormal
            for q, bodies in model.items():
                assert await _bodies(store, "m", q) == bodies
            for k, body in list(keyed.items())[-3:]:
                found = await store.lookup(KeyKind.KEY, k)
                assert [m.body for m in found] == [body]
    finally:
        await store.close()


async def test_operator_can_choose_to_truncate_damage(tmp_path: Path) -> None:
    base = tmp_path / "s"
    store = await MessageStore.open(small_config(base))
    first = await store.append(Message("t", b"first record"))
    second = await store.append(Message("t", b"second record"))
    await store.close()
    assert second.physical_offset > first.physical_offset  # the valid record after the damage
    (base / CHECKPOINT_FILE).unlink()
    (base / ABORT_FILE).touch()
    _poke(_segment0(base), first.physical_offset + 60, b"X")
    with pytest.raises(CorruptLog):
        await MessageStore.open(small_config(base))
    store = await MessageStore.open(small_config(base, truncate_damaged_tail=True))
    try:
        assert store.recovery is not None and store.recovery.dropped_after_damage
        assert store.write_offset == first.physical_offset
        assert store.queue_range("t", 0) == (0, 0)
    finally:
        await store.close()


async def test_queue_truncated_back_across_a_file_boundary_keeps_its_end(tmp_path: Path) -> None:
    """A crash loses the log records of queue offsets 3 and 4 while their entries survive, the
    entry for 4 in a new queue file. Recovery removes both, which empties that file; the queue's
    end must stay 3 through a clean reopen, so the next append fills offset 3, not 4."""
    base = tmp_path / "s"
    # Four entries per queue file, so offset 4 starts a new one; no periodic checkpoint.
    cfg = small_config(base, cq_entries_per_file=4, checkpoint_interval_ms=600_000)
    store = await MessageStore.open(cfg)
    for i in range(3):
        await store.append(Message("t", f"kept-{i}".encode()))
    await store.close()
    store = await MessageStore.open(cfg)
    lost = [await store.append(Message("t", f"lost-{i}".encode())) for i in range(2)]
    assert [r.queue_offset for r in lost] == [3, 4]
    store.abandon()
    # As if the kill came before the group commit wrote the two records into the segment.
    end = lost[-1].physical_offset + lost[-1].size
    _poke(_segment0(base), lost[0].physical_offset, bytes(end - lost[0].physical_offset))

    store = await MessageStore.open(cfg)
    assert store.recovery is not None and store.recovery.abnormal
    assert store.queue_range("t", 0) == (0, 3)
    await store.close()
    store = await MessageStore.open(cfg)  # a clean open: nothing truncates, the end is loaded
    try:
        assert store.queue_range("t", 0) == (0, 3)
        again = await store.append(Message("t", b"after"))
        assert again.queue_offset == 3
        got = await store.get_messages("t", 0, 0, max_count=10)
        assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3]
        assert [m.body for m in got.messages] == [b"kept-0", b"kept-1", b"kept-2", b"after"]
    finally:
        await store.close()
