"""What `bench peers` asks of each system it measures, whatever its protocol.

A :class:`System` is one broker in one durability setting: txbroker with sync or async flush,
RabbitMQ with a classic or a quorum queue, NATS JetStream with file storage. The workloads
(``workloads.py``) only publish bodies, await their acknowledgements and consume, so every
system runs the same code path around its own standard asyncio client.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["OnBody", "PeerUnavailable", "System", "SystemInfo", "reason"]

# Called by a subscription with each body as it arrives (before the ack is sent).
OnBody = Callable[[bytes], None]


class PeerUnavailable(Exception):
    """The system cannot be measured on this machine: not reachable, or its client is not
    installed. The bench skips it with this message; it is not a failure."""


@dataclass(frozen=True, slots=True)
class SystemInfo:
    key: str  # stable, for --peers and JSON: "txbroker-sync", "rabbitmq-quorum", ...
    label: str  # for people: "RabbitMQ quorum queue"
    durability: str  # when the acknowledgement is sent, relative to the disk
    is_txbroker: bool


class System(ABC):
    """One broker in one durability setting, reached through its standard asyncio client.

    The lifecycle per run: :meth:`connect` once (raising :class:`PeerUnavailable` when it
    cannot), then per workload and round :meth:`create` a fresh queue, publish and perhaps
    :meth:`subscribe`, and :meth:`delete` it; :meth:`disconnect` at the end. Names are unique
    per run, so nothing is left behind on a shared RabbitMQ or NATS server."""

    info: SystemInfo
    version: str = ""  # the server's version, when its handshake says

    @abstractmethod
    async def connect(self) -> None: ...

    @abstractmethod
    async def disconnect(self) -> None: ...

    @abstractmethod
    async def create(self, name: str) -> None:
        """Create the queue (topic, stream) ``name`` that the next publishes go to."""

    @abstractmethod
    async def delete(self, name: str) -> None:
        """Delete ``name`` and what it stored; no error when it is already gone."""

    @abstractmethod
    async def publish(self, body: bytes) -> None:
        """Publish one message; return once the broker has acknowledged it."""

    @abstractmethod
    async def publish_batch(self, bodies: list[bytes]) -> None:
        """Publish ``bodies`` as the client's batch; return once all are acknowledged."""

    @abstractmethod
    async def subscribe(self, on_body: OnBody) -> None:
        """Start consuming the current queue on a connection of its own, acknowledging each
        message after ``on_body`` has seen it."""

    @abstractmethod
    async def unsubscribe(self) -> None: ...

    @abstractmethod
    async def sweep(self, prefix: str) -> None:
        """Delete anything this run created (names starting with ``prefix``) that is still
        there after a failure."""


def reason(e: BaseException) -> str:
    """An exception as one short line, for a skipped or failed system's message."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
