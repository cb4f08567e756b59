"""RabbitMQ in `bench peers`, through aio-pika (the `bench` extra): a durable queue, persistent
messages and publisher confirms, with a classic or a quorum queue.

A persistent message routed to a durable queue is confirmed once it is on disk, the message
store fsyncing in batches (https://www.rabbitmq.com/docs/confirms); a quorum queue confirms once
a quorum of its Raft members has it in its log, on one node that node's write-ahead log
(https://www.rabbitmq.com/docs/quorum-queues).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from txbroker.bench.peers.system import OnBody, PeerUnavailable, System, SystemInfo, reason

if TYPE_CHECKING:
    from aio_pika.abc import (
        AbstractChannel,
        AbstractConnection,
        AbstractIncomingMessage,
        AbstractQueue,
    )

__all__ = ["RABBITMQ_SYSTEMS", "RabbitMQSystem"]

RABBITMQ_SYSTEMS = {
    "classic": SystemInfo(
        "rabbitmq-classic",
        "RabbitMQ classic durable queue",
        "persistent + confirms: confirm after the message store's batched fsync "
        "(docs: every few hundred ms, or when the queue is idle)",
        is_txbroker=False,
    ),
    "quorum": SystemInfo(
        "rabbitmq-quorum",
        "RabbitMQ quorum queue",
        "confirms: Raft log (WAL) fsync before confirm; 1 node, so a quorum of 1",
        is_txbroker=False,
    ),
}
CONNECT_TIMEOUT_S = 5.0
# Unacknowledged deliveries per consumer: the same 256 a txbroker long poll returns at most.
CONSUMER_PREFETCH = 256


class RabbitMQSystem(System):
    def __init__(self, queue_type: str, url: str) -> None:
        self.info = RABBITMQ_SYSTEMS[queue_type]
        self.queue_type = queue_type
        self.url = url
        self._conn: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._queue = ""
        self._undeleted: set[str] = set()  # created, and not yet deleted for sure
        self._sub_conn: AbstractConnection | None = None

    async def connect(self) -> None:
        try:
            import aio_pika
        except ImportError as e:
            raise PeerUnavailable(
                "aio-pika is not installed (pip install 'txbroker[bench]')"
            ) from e
        # aio-pika logs a refused connection as an error, traceback and all, before raising it;
        # the skip line says it once.
        quiet = logging.getLogger("aiormq.connection")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            self._conn = await aio_pika.connect(self.url, timeout=CONNECT_TIMEOUT_S)
            self._channel = await self._conn.channel(publisher_confirms=True)
        except Exception as e:
            await self.disconnect()
            raise PeerUnavailable(f"not reachable at {_safe(self.url)}: {reason(e)}") from e
        finally:
            quiet.setLevel(level)
        self.version = _server_version(self._conn)

    async def disconnect(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def _ch(self) -> AbstractChannel:
        assert self._channel is not None, "connect() first"
        return self._channel

    async def create(self, name: str) -> None:
        self._undeleted.add(name)
        await self._ch().declare_queue(
            name, durable=True, arguments={"x-queue-type": self.queue_type}
        )
        self._queue = name

    async def delete(self, name: str) -> None:
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.queue_delete(name)
                self._undeleted.discard(name)

    async def sweep(self, prefix: str) -> None:
        """RabbitMQ cannot list queues over AMQP: delete by the names this run created, on a
        connection of its own (an error may have closed the run's channel)."""
        if not self._undeleted:
            return
        import aio_pika

        async with await aio_pika.connect(self.url, timeout=CONNECT_TIMEOUT_S) as conn:
            channel = await conn.channel()
            for name in sorted(self._undeleted):
                await channel.queue_delete(name)
        self._undeleted.clear()

    async def publish(self, body: bytes) -> None:
        from aio_pika import DeliveryMode, Message

        # With confirms on, publish returns once the broker has confirmed (or raises on a nack).
        await self._ch().default_exchange.publish(
            Message(body, delivery_mode=DeliveryMode.PERSISTENT), routing_key=self._queue
        )

    async def publish_batch(self, bodies: list[bytes]) -> None:
        from aio_pika import DeliveryMode, Message

        exchange = self._ch().default_exchange
        queue = self._queue
        # All frames go out before the first confirm is awaited.
        await asyncio.gather(
            *(
                exchange.publish(Message(b, delivery_mode=DeliveryMode.PERSISTENT), queue)
                for b in bodies
            )
        )

    async def subscribe(self, on_body: OnBody) -> None:
        import aio_pika

        self._sub_conn = await aio_pika.connect(self.url, timeout=CONNECT_TIMEOUT_S)
        channel = await self._sub_conn.channel()
        await channel.set_qos(prefetch_count=CONSUMER_PREFETCH)
        queue: AbstractQueue = await channel.get_queue(self._queue, ensure=False)

        async def on_message(message: AbstractIncomingMessage) -> None:
            on_body(message.body)
            await message.ack()

        await queue.consume(on_message)

    async def unsubscribe(self) -> None:
        conn, self._sub_conn = self._sub_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()


def _server_version(conn: object) -> str:
    """The version RabbitMQ announced in its handshake, when the client kept it."""
    transport = getattr(conn, "transport", None)
    props: dict[str, Any] = getattr(getattr(transport, "connection", None), "server_properties", {})
    version = (props or {}).get("version", "")
    return version.decode() if isinstance(version, bytes) else str(version)


def _safe(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.rpartition("@")
    if not sep:
        return url
    scheme, _, userinfo = head.partition("://")
    return f"{scheme}://{userinfo.split(':', 1)[0]}@{tail}"
