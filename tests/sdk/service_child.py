"""A killable service process for the crash-window tests (armed with TXB_FAULTS by the parent).

    python -m tests.sdk.service_child place --db URL --broker txb://.. --check-url URL --orders N
    python -m tests.sdk.service_child consume --db URL --broker txb://.. --group billing --until N

``place`` prints each order id once its @transactional call returned (flushed at once), so the
parent knows what the service saw committed before it died. ``consume`` exits once the
payments table holds N rows and prints its counters as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tests.tx.conftest import GROUP
from txbroker_sdk import Client, ConsumedMessage
from txbroker_sdk.database import create_engine
from txbroker_sdk.subscriber import Subscribers
from txbroker_sdk.transactional import TxPublisher

TOPIC = "orders"
ORDERS = sa.Table(
    "orders",
    sa.MetaData(),
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("item", sa.String(64), nullable=False),
)
PAYMENTS = sa.Table(
    "payments",
    sa.MetaData(),
    sa.Column("order_id", sa.String(32), primary_key=True),
)
CONSUME_DEADLINE_S = 60.0  # a child that cannot finish must not outlive a broken test for long


async def _create(engine: AsyncEngine, table: sa.Table) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(table.metadata.create_all)


async def place(db: str, broker: str, check_url: str, orders: int, prefix: str) -> None:
    engine = create_engine(db)
    try:
        await _create(engine, ORDERS)
        async with await Client.connect(broker) as client:
            pub = TxPublisher(
                client, async_sessionmaker(engine), producer_group=GROUP, check_url=check_url
            )

            @pub.transactional(TOPIC, key=lambda oid: oid)
            async def place_order(session: AsyncSession, oid: str) -> str:
                await session.execute(ORDERS.insert().values(id=oid, item="book"))
                return oid

            for i in range(1, orders + 1):
                print(await place_order(f"{prefix}{i}"), flush=True)
    finally:
        await engine.dispose()


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.select(sa.func.count()).select_from(PAYMENTS)) or 0)


async def consume(db: str, broker: str, group: str, until: int) -> None:
    engine = create_engine(db)
    try:
        await _create(engine, PAYMENTS)
        async with await Client.connect(broker) as client:
            subs = Subscribers(client, async_sessionmaker(engine))

            @subs.subscriber(TOPIC, group=group)
            async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
                await session.execute(PAYMENTS.insert().values(order_id=msg.body.decode()))

            stop = asyncio.Event()
            runner = asyncio.create_task(subs.run(stop))
            deadline = time.monotonic() + CONSUME_DEADLINE_S
            # Watch the effect itself (the table), not the counters: that is what "done" means.
            while await _count(engine) < until:
                if runner.done() or time.monotonic() > deadline:
                    raise SystemExit(f"gave up at {await _count(engine)} of {until} payments")
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(runner, 30)
            counters = {"applied": subs.applied, "skipped": subs.skipped, "failed": subs.failed}
            print(json.dumps(counters), flush=True)
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="service_child")
    cmds = parser.add_subparsers(dest="cmd", required=True)
    p = cmds.add_parser("place")
    p.add_argument("--db", required=True)
    p.add_argument("--broker", required=True)
    p.add_argument("--check-url", required=True)
    p.add_argument("--orders", type=int, required=True)
    p.add_argument("--prefix", default="o")
    c = cmds.add_parser("consume")
    c.add_argument("--db", required=True)
    c.add_argument("--broker", required=True)
    c.add_argument("--group", default="billing")
    c.add_argument("--until", type=int, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "place":
        asyncio.run(place(args.db, args.broker, args.check_url, args.orders, args.prefix))
    else:
        asyncio.run(consume(args.db, args.broker, args.group, args.until))


if __name__ == "__main__":
    main()
