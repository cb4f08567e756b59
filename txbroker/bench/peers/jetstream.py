"""NATS JetStream in `bench peers`, through nats-py (the `bench` extra): a stream with file
storage and one replica, published to with PubAcks awaited.

A PubAck does not wait for an fsync: the server fsyncs file streams in the background every
``sync_interval`` (https://docs.nats.io/nats-concepts/jetstream, "Syncing data to disk"), so
without replication an OS crash can lose acknowledged messages. What the server on the build
machine did is in docs/benchmarks.md ("Against RabbitMQ and NATS JetStream").
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from txbroker.bench.peers.system import OnBody, PeerUnavailable, System, SystemInfo, reason

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

__all__ = ["NATS_SYSTEM", "JetStreamSystem"]

NATS_SYSTEM = SystemInfo(
    "nats-file",
    "NATS JetStream file storage",
    "no fsync before ack; fsync in the background every sync_interval, 2 min by default",
    is_txbroker=False,
)
CONNECT_TIMEOUT_S = 3.0


class JetStreamSystem(System):
    def __init__(self, url: str) -> None:
        self.info = NATS_SYSTEM
        self.url = url
        self._nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._subject = ""
        self._sub_nc: NATS | None = None
        self.errors: list[BaseException] = []

    async def _connect(self) -> NATS:
        import nats

        async def on_error(e: BaseException) -> None:
            self.errors.append(e)  # kept, not printed: a skipped peer says why in one line

        # The client retries an initial connect (0 attempts means forever): a few quick tries,
        # then the overall timeout, so an absent server is a skipped peer in about a second.
        async with asyncio.timeout(CONNECT_TIMEOUT_S * 2):
            nc: NATS = await nats.connect(
                self.url,
                connect_timeout=CONNECT_TIMEOUT_S,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=on_error,
            )
        return nc

    async def connect(self) -> None:
        try:
            import nats  # noqa: F401
        except ImportError as e:
            raise PeerUnavailable("nats-py is not installed (pip install 'txbroker[bench]')") from e
        try:
            self._nc = await self._connect()
            self._js = self._nc.jetstream()
            await self._js.account_info()  # fails when JetStream is not enabled
        except Exception as e:
            await self.disconnect()
            raise PeerUnavailable(f"not reachable at {self.url}: {reason(e)}") from e
        v = self._nc.connected_server_version
        self.version = f"{v.major}.{v.minor}.{v.patch}"

    async def disconnect(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()

    def _j(self) -> JetStreamContext:
        assert self._js is not None, "connect() first"
        return self._js

    async def create(self, name: str) -> None:
        from nats.js.api import StorageType

        await self._j().add_stream(
            name=name, subjects=[name], storage=StorageType.FILE, num_replicas=1
        )
        self._subject = name

    async def delete(self, name: str) -> None:
        if self._js is not None:
            with contextlib.suppress(Exception):
                await self._js.delete_stream(name)

    async def sweep(self, prefix: str) -> None:
        if self._js is None:
            return
        for info in await self._js.streams_info():
            if info.config.name and info.config.name.startswith(prefix):
                await self.delete(info.config.name)

    async def publish(self, body: bytes) -> None:
        await self._j().publish(self._subject, body)

    async def publish_batch(self, bodies: list[bytes]) -> None:
        js = self._j()
        subject = self._subject
        # nats-py's asynchronous publish: all go out, then every PubAck is awaited.
        acks = [await js.publish_async(subject, b) for b in bodies]
        await asyncio.gather(*acks)

    async def subscribe(self, on_body: OnBody) -> None:
        self._sub_nc = await self._connect()
        js = self._sub_nc.jetstream()

        async def on_msg(msg: Msg) -> None:
            on_body(msg.data)
            await msg.ack()

        # A push consumer, acknowledged one by one as the txbroker and RabbitMQ consumers are.
        await js.subscribe(self._subject, cb=on_msg, manual_ack=True)

    async def unsubscribe(self) -> None:
        nc, self._sub_nc = self._sub_nc, None
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()  # an ephemeral consumer goes with its stream's deletion
