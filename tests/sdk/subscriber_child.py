"""A subscriber process for the shutdown tests:
``python -m tests.sdk.subscriber_child DB BROKER idle|stuck``.

Consumes ``orders`` as group ``billing`` with a :data:`GRACE_S` shutdown grace and prints
READY once a message came through; ``stuck`` keeps that message's handler running until it is
cancelled (printing CANCELLED then). Returns when SIGTERM's stop has been honoured. Its log
(warnings: each failed fetch and connection attempt) goes to stderr."""

from __future__ import annotations

import asyncio
import logging
import sys

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from txbroker.runtime.signals import stop_on_signals
from txbroker_sdk import Client, ConsumedMessage, create_engine
from txbroker_sdk.subscriber import Subscribers

GRACE_S = 2.0


async def main(db: str, broker: str, mode: str) -> None:
    stop = stop_on_signals()
    engine = create_engine(db)
    async with Client(broker) as client:
        await client.create_topic("orders", queues=2, exist_ok=True)
        subscribers = Subscribers(client, async_sessionmaker(engine), shutdown_timeout_s=GRACE_S)

        consuming = asyncio.Event()

        @subscribers.subscriber("orders", group="billing")
        async def handle(session: AsyncSession, msg: ConsumedMessage) -> None:
            consuming.set()
            if mode == "stuck":
                try:
                    await asyncio.Event().wait()  # released only by the shutdown's cancel
                except asyncio.CancelledError:
                    print("CANCELLED", flush=True)
                    raise

        runner = asyncio.create_task(subscribers.run(stop))
        await client.send("orders", b"first")
        await consuming.wait()  # the message came through
        print("READY", flush=True)
        await runner
    await engine.dispose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
