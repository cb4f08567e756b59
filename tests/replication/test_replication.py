"""Master → slave replication with real broker processes (docs/cluster.md, "Replication")."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster.test_partition import stopped
from tests.replication.conftest import Brokers
from tests.server.test_consume import held_pulls
from txbroker.errors import NotMaster, ReplicationTimeout
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import AckRequest
from txbroker.store import KeyKind, MessageStore, StoreConfig
from txbroker_sdk import Client, Consumer

N = 400
BODY = 16 * 1024  # 400 x 16 KiB: past one 5 MiB segment


def _body(i: int) -> bytes:
    return f"m{i:06d}".encode().ljust(BODY, b".")


async def _consume_all(url: str, topic: str, want: set[bytes], timeout_s: float = 60) -> None:
    """Long-poll the slave until every body in ``want`` arrived (bounded)."""
    seen: set[bytes] = set()
    async with await Client.connect(url) as c, Consumer(c, "audit", topic) as consumer:
        deadline = time.monotonic() + timeout_s
        while not want <= seen:
            assert time.monotonic() < deadline, f"{len(want - seen)} messages never reached it"
            for m in await consumer.fetch(timeout_ms=1000):
                seen.add(m.body)
                m.ack()


def _segments(data_dir: Path) -> dict[str, bytes]:
    """The commit-log segments holding data, by name (empty preallocated ones left out)."""
    out = {}
    for p in sorted((data_dir / "store" / "commitlog").iterdir()):
        if p.name.isdigit():
            raw = p.read_bytes()
            if raw.count(0) != len(raw):
                out[p.name] = raw
    return out


async def test_slave_log_is_byte_identical_and_consumable(brokers: Brokers) -> None:
    master = brokers.master()
    slave = brokers.slave(master)
    async with await Client.connect(master.url) as c:
        await c.create_topic("orders", queues=4)
        for i in range(N):
            await c.send("orders", _body(i), key=f"k{i}")
    await _consume_all(slave.url, "orders", {_body(i) for i in range(N)})
    # Writes are the master's, and so are a group's committed offsets (a slave holds copies
    # of the master's): the slave refuses them, naming it.
    async with await Client.connect(slave.url) as c:
        with pytest.raises(NotMaster, match=master.url):
            await c.send("orders", b"not here")
        with pytest.raises(NotMaster, match=master.url):
            await c.request(Opcode.ACK, AckRequest("audit", "orders", "m", 1, []))
    assert slave.stop() == 0
    assert master.stop() == 0
    mine, theirs = _segments(master.data_dir), _segments(slave.data_dir)
    assert len(mine) == 2, "the log should have rolled into a second segment"
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert mine[name] == theirs[name], f"segment {name} differs"


@pytest.mark.slow
async def test_sync_acked_messages_are_on_the_slaves_disk(brokers: Brokers) -> None:
    master = brokers.master("master", "--replication", "sync", "--min-insync", "1")
    slave = brokers.slave(master)
    acked: list[str] = []
    async with await Client.connect(master.url) as c:
        await c.create_topic("pay", queues=2)

        async def produce(p: int) -> None:
            for i in range(60):
                key = f"p{p}-{i}"
                await c.send("pay", key.encode(), key=key)
                acked.append(key)

        await asyncio.gather(*(produce(p) for p in range(4)))
        master.kill()  # kill -9 right after the acks: the master flushes nothing more
    slave.kill()  # and the slave too: only what it had flushed can be found below
    store = await MessageStore.open(StoreConfig(slave.data_dir / "store"))
    try:
        missing = [k for k in acked if not await store.lookup(KeyKind.KEY, k, limit=1)]
    finally:
        await store.close()
    assert len(acked) == 240
    assert missing == [], f"{len(missing)} acknowledged messages not on the slave: {missing[:5]}"


async def test_sync_send_fails_in_bounded_time_without_its_slave(brokers: Brokers) -> None:
    master = brokers.master("master", "--replication", "sync", "--replication-timeout-ms", "1000")
    slave = brokers.slave(master)
    lone = brokers.master("async-master")  # async replication (the default), slave gone too
    lone_slave = brokers.slave(lone, "async-slave")
    async with await Client.connect(master.url) as c, await Client.connect(lone.url) as a:
        await c.create_topic("t", queues=1)
        await a.create_topic("t", queues=1)
        async with await Client.connect(slave.url) as on_slave:  # answered once it had it
            assert (await on_slave.describe_topic("t")).queues == 1
        await c.send("t", b"while the slave runs")
        await a.send("t", b"while the slave runs")
        slave.stop()
        lone_slave.stop()
        t0 = time.monotonic()
        with pytest.raises(ReplicationTimeout, match="0 of the 1 slaves"):
            await c.send("t", b"no slave to flush it")
        waited = time.monotonic() - t0
        assert 0.5 < waited < 5, waited
        # A topic creation is acknowledged as a write is; it is made on the master all the same.
        with pytest.raises(ReplicationTimeout, match=r"0 of the 1 slaves .* topics"):
            await c.create_topic("u", queues=1)
        assert (await c.describe_topic("u")).queues == 1
        for i in range(20):  # async replication does not wait for slaves
            await asyncio.wait_for(a.send("t", f"async {i}".encode()), timeout=5)
        await asyncio.wait_for(a.create_topic("u", queues=1), timeout=5)


async def test_a_resent_write_is_not_acknowledged_before_its_slave_has_it(
    brokers: Brokers,
) -> None:
    """The first attempt timed out waiting for the slave, but its record is in the master's
    log: the same idempotency key sent again finds it there, and must not be answered as a
    duplicate (an acknowledgement) while no slave holds it."""
    master = brokers.master("master", "--replication", "sync", "--replication-timeout-ms", "1000")
    slave = brokers.slave(master)
    async with await Client.connect(master.url) as c:
        await c.create_topic("t", queues=1)
        await c.send("t", b"replicated", idempotency_key="first")
        slave.stop()
        with pytest.raises(ReplicationTimeout):
            await c.send("t", b"on the master only", idempotency_key="second")
        with pytest.raises(ReplicationTimeout):
            await c.send("t", b"on the master only", idempotency_key="second")
        # One already on the slave is answered as a duplicate at once.
        again = await asyncio.wait_for(c.send("t", b"replicated", idempotency_key="first"), 5)
        assert again.duplicate
        brokers.slave(master, "slave")  # the same data directory: it catches up
        async with asyncio.timeout(30):
            while True:
                try:
                    receipt = await c.send("t", b"on the master only", idempotency_key="second")
                    break
                except ReplicationTimeout:
                    continue  # the slave is still starting; each attempt waits 1 s
        assert receipt.duplicate


async def test_a_killed_slave_recovers_and_catches_up(brokers: Brokers) -> None:
    master = brokers.master()
    slave = brokers.slave(master)
    async with await Client.connect(master.url) as c:
        await c.create_topic("orders", queues=2)
        for i in range(100):
            await c.send("orders", _body(i))
        await _consume_all(slave.url, "orders", {_body(i) for i in range(100)})
        slave.kill()  # kill -9: an ordinary store recovery at the next start
        for i in range(100, 300):  # past the first segment while the slave is away
            await c.send("orders", _body(i))
    again = brokers.slave(master)  # the same data directory
    await _consume_all(again.url, "orders", {_body(i) for i in range(300)})
    assert again.stop() == 0
    assert master.stop() == 0
    assert _segments(master.data_dir) == _segments(slave.data_dir)


async def test_sync_consumers_see_only_what_a_slave_holds(brokers: Brokers) -> None:
    """A record no slave has yet may still be lost to a failover: with sync replication the
    master's consumers do not see it until a slave reports it flushed."""
    master = brokers.master("master", "--replication", "sync", "--replication-timeout-ms", "1000")
    slave = brokers.slave(master)
    async with await Client.connect(master.url) as c:
        await c.create_topic("t", queues=1)
        await c.send("t", b"replicated")
        slave.stop()
        with pytest.raises(ReplicationTimeout):
            await c.send("t", b"on the master only")
        async with Consumer(c, "early", "t") as consumer:
            seen = [m.body for m in await consumer.fetch(timeout_ms=1500)]
        assert seen == [b"replicated"]
        again = brokers.slave(master, "slave")  # the same data directory: it catches up
        await _consume_all(master.url, "t", {b"replicated", b"on the master only"})
    assert again.stop() == 0


async def test_a_held_pull_is_answered_once_the_slave_holds_a_timed_out_write(
    brokers: Brokers,
) -> None:
    """A write whose wait for the slave timed out stands in the master's log, and consumers read
    it once the slave holds it. A pull held for it then is answered then, not when its hold
    runs out: no append wakes its queue at that moment (the write's own wake-up failed)."""
    hold_s, woken_within_s = 30, 10  # a pull nobody woke cannot pass
    master = brokers.master("master", "--replication", "sync", "--replication-timeout-ms", "1000")
    slave = brokers.slave(master)
    assert slave.proc is not None
    async with (
        await Client.connect(master.url) as c,
        httpx.AsyncClient(base_url=master.http) as h,
    ):
        await c.create_topic("t", queues=1)
        async with Consumer(c, "g", "t", with_retries=False) as consumer:
            with stopped(slave.proc.pid):
                with pytest.raises(ReplicationTimeout):
                    await c.send("t", b"late")
                pull = asyncio.create_task(consumer.fetch(timeout_ms=hold_s * 1000))
                async with asyncio.timeout(woken_within_s):
                    while True:
                        if await held_pulls(h):
                            break
                        await asyncio.sleep(0.01)  # polling the broker's count: no event to await
                assert not pull.done()  # nothing readable while the slave is frozen
                thawed = time.monotonic()
            msgs = await asyncio.wait_for(pull, woken_within_s)
            assert time.monotonic() - thawed < woken_within_s < hold_s
            assert [m.body for m in msgs] == [b"late"]
