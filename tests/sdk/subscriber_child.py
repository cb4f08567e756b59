"""A subscriber process for the shutdown test: ``python -m tests.sdk.subscriber_child DB BROKER``.

Consumes ``orders`` as group ``billing`` with a 2 s shutdown grace, prints READY once it is
consuming, and returns when SIGTERM's stop has been honoured."""

from __future__ import annotations

import asyncio
import sys

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txbroker_sdk import Client, ConsumedMessage, create_engine, stop_on_signals
from txbroker_sdk.subscriber import Subscribers

GRACE_S = 2.0


async def main(db: str, broker: str) -> None:
    stop = stop_on_signals()
    engine = create_engine(db)
    async with Client(broker) as client:
        await client.create_topic("orders", queues=2, exist_ok=True)
        subscribers = Subscribers(client, async_sessionmaker(engine), shutdown_timeout_s=GRACE_S)

        consuming = asyncio.Event()

        @subscribers.subscriber("orders", group="billing")
        async def handle(session: AsyncSession, msg: ConsumedMessage) -> None:
            consuming.set()

        runner = asyncio.create_task(subscribers.run(stop))
        await client.send("orders", b"first")
        await consuming.wait()  # the message came through
        print("READY", flush=True)
        await runner
    await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
