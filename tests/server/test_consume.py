"""Consuming from a real broker process: round trip, a send waking a held pull, rebalancing
without loss, broadcast, and offsets across a restart."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import httpx

from tests.conftest import BrokerProcess
from tests.server.test_metrics import scrape, value
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import DlqRequest, HeartbeatRequest, PullRequest
from txbroker_sdk import Client, ConsumedMessage, Consumer


async def _drain(consumer: Consumer, want: int, timeout_s: float = 20) -> list[ConsumedMessage]:
    got: list[ConsumedMessage] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} messages arrived"
        batch = await consumer.fetch(timeout_ms=500)
        for m in batch:
            m.ack()
        got.extend(batch)
    return got


async def test_round_trip_in_queue_order(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=2)
        for i in range(20):
            await c.send("orders", str(i).encode(), key=f"k{i % 2}", headers={"n": str(i)})
        async with Consumer(c, "billing", "orders") as consumer:
            got = await _drain(consumer, 20)
        per_queue: dict[int, list[int]] = {}
        for m in got:
            per_queue.setdefault(m.msg.queue_id, []).append(m.msg.queue_offset)
            assert m.msg.headers == {"n": m.body.decode()}
        assert sorted(int(m.body) for m in got) == list(range(20))
        assert all(offs == sorted(offs) for offs in per_queue.values())


async def held_pulls(h: httpx.AsyncClient) -> float:
    return value(await scrape(h), "txbroker_server_longpolls")


async def test_a_send_wakes_a_held_pull_long_before_its_hold_ends(broker: BrokerProcess) -> None:
    # The mechanism, not a latency figure (that is `txbroker bench e2e`'s publish-to-consume
    # latency): a pull parked for hold_s answers a send well before then, so the send's
    # notification woke it and not its hold timer. The bound is generous for a loaded machine
    # and still a third of the hold, so a pull nobody woke cannot pass.
    hold_s, woken_within_s = 30, 10
    async with (
        await Client.connect(broker.url) as c,
        await Client.connect(broker.url) as p,
        httpx.AsyncClient(base_url=broker.http) as h,
    ):
        await c.create_topic("lp", queues=1)
        # Without the group's retry topic, whose pull would be held too: one pull, one queue.
        async with Consumer(c, "g", "lp", with_retries=False) as consumer:
            assert await consumer.fetch(timeout_ms=100) == []  # nothing there: held, then empty
            assert await held_pulls(h) == 0
            for i in range(3):
                pull = asyncio.create_task(consumer.fetch(timeout_ms=hold_s * 1000))
                async with asyncio.timeout(woken_within_s):
                    while True:
                        if held := await held_pulls(h):
                            break
                        await asyncio.sleep(0.01)  # polling the broker's count: no event to await
                assert held == 1
                assert not pull.done()
                sent = time.monotonic()
                await p.send("lp", str(i).encode())
                msgs = await asyncio.wait_for(pull, woken_within_s)
                assert time.monotonic() - sent < woken_within_s < hold_s
                assert [m.body for m in msgs] == [str(i).encode()]
                msgs[0].ack()
                assert await held_pulls(h) == 0  # answered, not left parked


async def test_rebalance_on_join_and_leave_loses_nothing(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("rb", queues=4)
        for i in range(200):
            await c.send("rb", str(i).encode())
        seen: set[int] = set()
        a = Consumer(c, "g", "rb", member_id="a", max_messages=10)
        await a.start()
        first = await a.fetch(timeout_ms=500)
        assert first and set(a.queues) == {0, 1, 2, 3}
        for m in first[:5]:  # half processed, half still in flight when b joins
            m.ack()
            seen.add(int(m.body))
        in_flight = first[5:]
        await a.commit()
        b = Consumer(c, "g", "rb", member_id="b", max_messages=50)
        await b.start()  # joins: generation moves, queues split 2/2
        await a._heartbeat()
        assert set(a.queues) | set(b.queues) == {0, 1, 2, 3} and not set(a.queues) & set(b.queues)
        # a finishes what it had in flight: acks for queues it kept count; for queues b took over
        # they are ignored and b delivers those messages again (at least once, none skipped).
        for m in in_flight:
            m.ack()
            if m.msg.queue_id in a.queues:
                seen.add(int(m.body))  # only an ack that counted; b must deliver the rest
        deadline = time.monotonic() + 20
        while len(seen) < 200:
            assert time.monotonic() < deadline, f"lost {sorted(set(range(200)) - seen)[:10]}"
            for consumer in (a, b):
                for m in await consumer.fetch(timeout_ms=100):
                    m.ack()
                    seen.add(int(m.body))
                await consumer.commit()
            if len(seen) > 120 and b.queues != [0, 1, 2, 3]:
                await b.close()  # b leaves mid-way; a takes its queues back
                await a._heartbeat()
                b = a
        assert seen == set(range(200))
        await a.close()


async def test_broadcast_delivers_everything_to_every_member(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("bc", queues=3)
        for i in range(30):
            await c.send("bc", str(i).encode())
        async with (
            Consumer(c, "cache", "bc", member_id="x", mode="broadcast") as x,
            Consumer(c, "cache", "bc", member_id="y", mode="broadcast") as y,
        ):
            for consumer in (x, y):
                got = await _drain(consumer, 30)
                assert sorted(int(m.body) for m in got) == list(range(30))


async def test_offsets_survive_a_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b").start()
    async with await Client.connect(b.url) as c:
        await c.create_topic("o", queues=1)
        for i in range(10):
            await c.send("o", str(i).encode())
        async with Consumer(c, "g", "o") as consumer:
            got = await _drain(consumer, 4)
            await consumer.commit()
    assert b.stop() == 0
    b2 = BrokerProcess(tmp_path / "b").start()
    try:
        async with await Client.connect(b2.url) as c, Consumer(c, "g", "o") as consumer:
            rest = await _drain(consumer, 10 - len(got))
            assert [int(m.body) for m in rest] == list(range(len(got), 10))
    finally:
        b2.stop()


async def test_latest_start_skips_history(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("late", queues=1)
        await c.send("late", b"old")
        async with Consumer(c, "newcomer", "late", start="latest") as consumer:
            await c.send("late", b"new")
            got = await _drain(consumer, 1)
            assert [m.body for m in got] == [b"new"]


async def test_delayed_messages_survive_restart_and_kill(tmp_path: Path) -> None:
    # (start asked, ready) of each broker run, wall ms: a message due while no broker was up is
    # delivered by the next one, within the bound of its readiness rather than of its due time.
    runs: list[tuple[int, int]] = []

    def start() -> BrokerProcess:
        asked = time.time_ns() // 1_000_000
        broker = BrokerProcess(tmp_path / "d").start()
        runs.append((asked, time.time_ns() // 1_000_000))
        return broker

    b = start()
    now = time.time_ns() // 1_000_000
    targets = {"soon": now + 1500, "later": now + 4000, "next": now + 2500}
    async with await Client.connect(b.url) as c:
        await c.create_topic("delayed", queues=2)
        for body, at in targets.items():
            r = await c.send("delayed", body.encode(), deliver_at_ms=at)
            assert r.queue_offset == -1
    assert b.stop() == 0  # a clean restart while everything still waits
    b = start()
    async with await Client.connect(b.url) as c, Consumer(c, "g", "delayed") as consumer:
        first = await _drain(consumer, 1)
        assert first[0].body == b"soon"
    b.kill()  # and a crash while "next" and "later" are mid-cascade
    b = start()
    try:
        async with await Client.connect(b.url) as c, Consumer(c, "g", "delayed") as consumer:
            got = list(first)
            deadline = time.monotonic() + 15
            while {m.body.decode() for m in got} != set(targets):
                assert time.monotonic() < deadline, [m.body for m in got]
                batch = await consumer.fetch(timeout_ms=500)
                for m in batch:
                    m.ack()
                got.extend(batch)
            await asyncio.sleep(1.0)  # would a duplicate copy show up? give it the time to
            got.extend(await consumer.fetch(timeout_ms=200))
        # The crash may redeliver an acknowledged message (its offset commit was not yet saved:
        # at-least-once), but the scheduler must never have stored a second copy.
        copies = {(m.body, m.msg.queue_id, m.msg.queue_offset) for m in got}
        assert sorted(body.decode() for body, _, _ in copies) == sorted(targets)
        for m in got:
            at, stored = targets[m.body.decode()], m.msg.store_ms
            ready = max(r for asked, r in runs if asked <= stored)  # the run that stored it
            # Never early; at most a second late, counted from when a broker was up to do it.
            assert at <= stored <= max(at, ready) + 1000, (m.body, stored - at, ready - at)
    finally:
        b.stop()


async def test_nack_retries_with_delays_then_dead_letters_then_redrive(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("retry_delays_ms = [200, 400, 600]\nmax_reconsume = 3\n")
    b = BrokerProcess(tmp_path / "r", "--config", str(cfg)).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("jobs", queues=2)
            await c.send("jobs", b"poison", key="p")
            await c.send("jobs", b"fine", key="f")
            async with Consumer(c, "workers", "jobs") as consumer:
                attempts: list[tuple[int, float]] = []
                deadline = time.monotonic() + 20
                while len(attempts) < 4:
                    assert time.monotonic() < deadline, attempts
                    for m in await consumer.fetch(timeout_ms=500):
                        if m.body == b"fine":
                            m.ack()
                            continue
                        attempts.append((m.reconsume_count, time.monotonic()))
                        res = await m.nack()
                        assert res.reconsume_count == m.reconsume_count + 1
                        assert res.dead_lettered == (res.reconsume_count > 3)
                assert [rc for rc, _ in attempts] == [0, 1, 2, 3]
                gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
                for gap, want in zip(gaps, (0.2, 0.4, 0.6), strict=True):
                    assert want - 0.05 <= gap <= want + 1.0, gaps
                # Dead-lettered after the third retry: it must not come back on its own.
                assert await consumer.fetch(timeout_ms=1500) == []
                await consumer.commit()
            dlq = await c.request(Opcode.DLQ_LIST, DlqRequest("workers"))
            assert [(m.body, m.original_topic, m.reconsume_count) for m in dlq.messages] == [
                (b"poison", "jobs", 4)
            ]
            first = await c.request(Opcode.DLQ_REDRIVE, DlqRequest("workers"))
            again = await c.request(Opcode.DLQ_REDRIVE, DlqRequest("workers"))
            assert (first.redriven, again.redriven) == (1, 0)
            async with Consumer(c, "workers", "jobs") as consumer:
                back = await _drain(consumer, 1)
                assert [(m.body, m.reconsume_count) for m in back] == [(b"poison", 0)]
                assert await consumer.fetch(timeout_ms=300) == []  # exactly one copy came back
    finally:
        b.stop()


async def test_timestamp_start(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("ts", queues=1)
        for i in range(3):
            await c.send("ts", f"old{i}".encode())
        await asyncio.sleep(0.05)  # a distinct store time for the boundary
        boundary = time.time_ns() // 1_000_000
        for i in range(2):
            await c.send("ts", f"new{i}".encode())
        async with Consumer(
            c, "from-ts", "ts", start="timestamp", start_timestamp_ms=boundary
        ) as consumer:
            got = await _drain(consumer, 2)
        assert [m.body for m in got] == [b"new0", b"new1"]


async def test_a_lost_pull_answer_is_read_again(broker: BrokerProcess) -> None:
    """The broker keeps no read position: an answer that never reaches the client (here, one
    whose request the client abandons) does not move the group past those messages."""
    async with await Client.connect(broker.url) as c:
        await c.create_topic("lost", queues=1)
        for i in range(5):
            await c.send("lost", str(i).encode())
        hb = await c.request(Opcode.HEARTBEAT, HeartbeatRequest("g", "lost", "m"))
        abandoned = await c.request(Opcode.PULL, PullRequest("g", "lost", "m", hb.generation, 3))
        assert [m.body for m in abandoned.messages] == [b"0", b"1", b"2"]
        again = await c.request(Opcode.PULL, PullRequest("g", "lost", "m", hb.generation, 10))
        assert [m.body for m in again.messages] == [b"0", b"1", b"2", b"3", b"4"]


async def test_a_pull_answer_stays_under_the_frame_limit(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("big", queues=1)
        for i in range(5):
            await c.send("big", bytes([i]) * (3_500_000))  # 5 of them: over a 16 MiB frame
        async with Consumer(c, "g", "big") as consumer:
            got = await _drain(consumer, 5)
        assert [m.body[0] for m in got] == [0, 1, 2, 3, 4]


async def test_a_resend_after_a_nack_still_gets_the_original_receipt(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("pay", queues=1)
        first = await c.send("pay", b"charge", idempotency_key="charge-1")
        async with Consumer(c, "g", "pay") as consumer:
            [m] = await _drain_unacked(consumer, 1)
            await m.nack()
        again = await c.send("pay", b"charge", idempotency_key="charge-1")
        assert again.duplicate
        assert (again.topic, again.queue_id, again.queue_offset) == ("pay", 0, first.queue_offset)


async def _drain_unacked(consumer: Consumer, want: int) -> list[ConsumedMessage]:
    got: list[ConsumedMessage] = []
    deadline = time.monotonic() + 10
    while len(got) < want:
        assert time.monotonic() < deadline
        got.extend(await consumer.fetch(timeout_ms=500))
    return got


async def test_acks_across_a_rebalance_count_for_kept_queues(broker: BrokerProcess) -> None:

    async with await Client.connect(broker.url) as c:
        await c.create_topic("keep", queues=2)
        for i in range(20):
            await c.send("keep", str(i).encode())
        a = Consumer(c, "g", "keep", member_id="a", max_messages=100)
        await a.start()
        delivered = await a.fetch(timeout_ms=500)
        while len(delivered) < 20:
            delivered += await a.fetch(timeout_ms=500)
        b = Consumer(c, "g", "keep", member_id="b")
        await b.start()
        await a._heartbeat()  # a keeps one queue, b takes the other
        [kept] = a.queues
        for m in delivered:  # a finishes everything it had in flight
            m.ack()
        await a.commit()
        async with httpx.AsyncClient(base_url=broker.http) as h:
            groups = (await h.get("/v1/groups")).json()["groups"]
        [g] = [g for g in groups if g["group"] == "g" and g["topic"] == "keep"]
        assert g["lag"][str(kept)] == 0  # the acks on the kept queue counted
        await b.close()
        await a.close()
