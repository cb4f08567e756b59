"""@subscriber on a real broker and real databases: each message applied exactly once, also
when the consumer dies between its database commit and its ack; failures retry then DLQ."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from sdk import Client, ConsumedMessage, Consumer
from sdk.subscriber import Subscribers, apply_once
from tests.conftest import BrokerProcess

PAYMENTS = sa.Table(
    "payments",
    sa.MetaData(),
    sa.Column("order_id", sa.String(32), primary_key=True),
)


async def _charge(session: AsyncSession, msg: ConsumedMessage) -> None:
    await session.execute(PAYMENTS.insert().values(order_id=msg.body.decode()))


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.select(sa.func.count()).select_from(PAYMENTS)) or 0)


async def test_redelivery_after_commit_before_ack_is_skipped(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
    sessions = async_sessionmaker(engine)
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            for i in range(5):
                await c.send("orders", f"o{i}".encode())
            # A consumer applies everything, then "dies" before acknowledging anything.
            async with Consumer(c, "billing", "orders", member_id="doomed") as first:
                got: list[ConsumedMessage] = []
                while len(got) < 5:
                    got += await first.fetch(timeout_ms=500)
                for m in got:
                    assert await apply_once(sessions, "billing", m, _charge)
            # (no ack, so its commit on close has nothing to commit)
            subs = Subscribers(c, sessions)
            subs.subscriber("orders", group="billing")(_charge)
            stop = asyncio.Event()
            runner = asyncio.create_task(subs.run(stop))
            deadline = time.monotonic() + 15
            while subs.skipped < 5:
                assert time.monotonic() < deadline, (subs.applied, subs.skipped)
                await asyncio.sleep(0.05)  # watching the runner's counters
            stop.set()
            await asyncio.wait_for(runner, 10)
        assert await _count(engine) == 5 and subs.applied == 0  # effects applied once
    finally:
        broker.stop()


async def test_a_failing_handler_rolls_back_and_is_retried(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
    cfg = tmp_path / "fast.toml"
    cfg.write_text("retry_delays_ms = [100, 100]\nmax_reconsume = 2\n")
    broker = BrokerProcess(tmp_path / "b", "--config", str(cfg)).start()
    attempts: list[int] = []

    async def flaky(session: AsyncSession, msg: ConsumedMessage) -> None:
        attempts.append(msg.reconsume_count)
        await session.execute(PAYMENTS.insert().values(order_id="partial"))
        if len(attempts) < 3:
            raise RuntimeError("downstream timeout")  # the insert above must roll back

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            await c.send("orders", b"x")
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing")(flaky)
            stop = asyncio.Event()
            runner = asyncio.create_task(subs.run(stop))
            deadline = time.monotonic() + 15
            while subs.applied < 1:
                assert time.monotonic() < deadline, attempts
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(runner, 10)
        assert attempts == [0, 1, 2] and subs.failed == 2
        assert await _count(engine) == 1  # only the successful attempt's write survived
    finally:
        broker.stop()
