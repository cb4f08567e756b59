"""txbroker in `bench peers`: a `txbroker serve` child process per round, reached with the SDK's
asyncio client the way `bench produce` and `bench e2e` reach it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from txbroker.bench.broker_bench import broker_process
from txbroker.bench.peers.system import OnBody, System, SystemInfo
from txbroker.protocol.messages import SendRequest

if TYPE_CHECKING:
    from txbroker_sdk import Client, Consumer

__all__ = ["TXBROKER_SYSTEMS", "TxbrokerSystem"]

TXBROKER_SYSTEMS = {
    "sync": SystemInfo(
        "txbroker-sync",
        "txbroker sync flush",
        "fdatasync before ack (group commit)",
        is_txbroker=True,
    ),
    "async": SystemInfo(
        "txbroker-async",
        "txbroker async flush",
        "ack after write(); fdatasync in the background every 500 ms",
        is_txbroker=True,
    ),
}
# Queues per topic: the SDK's default for create_topic (one commit log behind them all).
TOPIC_QUEUES = 4
# As `bench e2e`: one long poll returns up to 256 messages, held up to a second when idle.
CONSUMER_MAX_MESSAGES = 256
CONSUMER_HOLD_MS = 1000


class TxbrokerSystem(System):
    """``flush`` is the broker's --flush; a fresh broker (and data directory) per round, since
    the bench calls :meth:`start_broker` and :meth:`stop_broker` around each round."""

    def __init__(self, flush: str, data_root: Path | None) -> None:
        self.info = TXBROKER_SYSTEMS[flush]
        self.version = _version()
        self.flush = flush
        self.data_root = data_root
        self._broker: contextlib.ExitStack | None = None
        self._url = ""
        self._client: Client | None = None
        self._topic = ""
        self._consumer_client: Client | None = None
        self._consumer: Consumer | None = None
        self._pump: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        pass  # the broker starts per round, in start_broker

    async def disconnect(self) -> None:
        await self.stop_broker()

    async def start_broker(self) -> None:
        from txbroker_sdk import Client

        stack = contextlib.ExitStack()
        # Blocking (it waits for the ready line): off the loop, which other clients share.
        self._url = await asyncio.to_thread(
            stack.enter_context, broker_process(self.flush, self.data_root)
        )
        self._broker = stack
        self._client = await Client.connect(self._url)

    async def stop_broker(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._broker is not None:
            await asyncio.to_thread(self._broker.close)
            self._broker = None

    def _c(self) -> Client:
        assert self._client is not None, "start_broker() first"
        return self._client

    async def create(self, name: str) -> None:
        await self._c().create_topic(name, queues=TOPIC_QUEUES)
        self._topic = name

    async def delete(self, name: str) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.delete_topic(name)

    async def sweep(self, prefix: str) -> None:
        pass  # the bench's own broker: its data directory goes with it

    async def publish(self, body: bytes) -> None:
        await self._c().send(self._topic, body)

    async def publish_batch(self, bodies: list[bytes]) -> None:
        topic = self._topic
        await self._c().send_batch([SendRequest(topic, b) for b in bodies])

    async def subscribe(self, on_body: OnBody) -> None:
        from txbroker_sdk import Client, Consumer

        self._consumer_client = await Client.connect(self._url)
        consumer = Consumer(
            self._consumer_client,
            "bench",
            self._topic,
            hold_ms=CONSUMER_HOLD_MS,
            max_messages=CONSUMER_MAX_MESSAGES,
        )
        await consumer.start()
        self._consumer = consumer

        async def pump() -> None:
            while True:
                for m in await consumer.fetch():
                    on_body(m.body)
                    m.ack()

        self._pump = asyncio.create_task(pump())

    async def unsubscribe(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
            self._pump = None
        if self._consumer is not None:
            await self._consumer.close()
            self._consumer = None
        if self._consumer_client is not None:
            await self._consumer_client.close()
            self._consumer_client = None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("txbroker")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree, not installed
        return ""
