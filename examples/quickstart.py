"""txbroker in one file: publish with @transactional and the outbox, apply exactly once.

txbroker serve --data-dir /tmp/txb --tx-secret shop=s3cret   # in one terminal
python -m examples.quickstart                               # in another
"""

import asyncio
import json
import os
import uuid

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from starlette.applications import Starlette

from txbroker_outbox import Relay, add
from txbroker_sdk import (
    Client,
    ConsumedMessage,
    Subscribers,
    TxPublisher,
    create_engine,
    mount,
    upgrade,
)
from txbroker_sdk.web import serving  # uvicorn on a free port, inside this program's loop

BROKER = os.environ.get("TXB_SERVER", "txb://127.0.0.1:9876")  # the CLI's names
TOKEN = os.environ.get("TXB_AUTH_TOKEN")  # for a broker started with one
DB = os.environ.get("DB_URL", "sqlite:///quickstart.db")  # or postgresql://user@host/db

meta = sa.MetaData()
orders = sa.Table("orders", meta, sa.Column("id", sa.String(32), primary_key=True))
emails = sa.Table("emails", meta, sa.Column("order_id", sa.String(32), primary_key=True))
payments = sa.Table("payments", meta, sa.Column("order_id", sa.String(32), primary_key=True))


async def main() -> None:
    upgrade(DB)  # txbroker's tables: the barrier, the inbox, the outbox (Alembic)
    engine = create_engine(DB)
    async with engine.begin() as conn:
        await conn.run_sync(meta.create_all)
    sessions = async_sessionmaker(engine)

    app = Starlette()  # your service's app: the check-back endpoint is one line
    check_path = mount(app, engine, {"shop": "s3cret"})
    async with serving(app) as base_url, await Client.connect(BROKER, auth_token=TOKEN) as client:
        await client.create_topic("orders", exist_ok=True)
        await client.create_topic("emails", exist_ok=True)
        publisher = TxPublisher(
            client, sessions, producer_group="shop", check_url=base_url + check_path
        )

        @publisher.transactional("orders", key=lambda order: order["id"])
        async def place_order(session: AsyncSession, order_id: str) -> dict[str, str]:
            await session.execute(orders.insert().values(id=order_id))
            # A second message, from the same transaction, through the outbox:
            await add(session, "emails", {"order_id": order_id}, key=order_id)
            return {"id": order_id}  # the `orders` message: sent only if this commits

        ids = {f"order-{uuid.uuid4().hex[:8]}" for _ in range(3)}
        subscribers = Subscribers(client, sessions)
        handled: list[str] = []
        all_handled = asyncio.Event()

        def seen(kind: str, order_id: str) -> None:
            handled.append(kind + order_id)
            if len(set(handled)) == 2 * len(ids):
                all_handled.set()

        @subscribers.subscriber("orders", group="billing")
        async def charge(session: AsyncSession, msg: ConsumedMessage) -> None:
            order = json.loads(msg.body)  # applied once: the inbox row commits with it
            await session.execute(payments.insert().values(order_id=order["id"]))
            seen("paid", order["id"])

        @subscribers.subscriber("emails", group="mailer")
        async def send_email(session: AsyncSession, msg: ConsumedMessage) -> None:
            order_id = json.loads(msg.body)["order_id"]
            await session.execute(emails.insert().values(order_id=order_id))
            seen("emailed", order_id)

        for order_id in ids:
            await place_order(order_id)
        print(f"placed {len(ids)} orders")

        stop = asyncio.Event()
        relay = Relay(client, engine, namespace="quickstart")
        running = asyncio.gather(subscribers.run(stop), relay.run(stop))
        async with asyncio.timeout(30):
            await all_handled.wait()
        stop.set()  # in-flight handlers finish and commit, then the runners return
        await running
    assert ids <= (await _ids(engine, payments)) & (await _ids(engine, emails))
    print(f"paid and emailed: {', '.join(sorted(ids))}")
    await engine.dispose()


async def _ids(engine: AsyncEngine, table: sa.Table) -> set[str]:
    async with engine.connect() as conn:
        return set((await conn.scalars(sa.select(table.c.order_id))).all())


if __name__ == "__main__":
    asyncio.run(main())
