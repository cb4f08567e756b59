"""The server's side of the transaction coordinator's interface (``txbroker.tx.ports``)."""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.protocol.messages import SendRequest
from txbroker.server.delay import DelayScheduler
from txbroker.server.producer import Producer
from txbroker.server.topics import TopicRegistry
from txbroker.store import Message

__all__ = ["TxPublishing"]


@dataclass(frozen=True, slots=True)
class TxPublishing:
    producer: Producer
    scheduler: DelayScheduler
    topics: TopicRegistry

    def to_message(self, req: SendRequest) -> Message:
        return self.producer.to_message(req)

    def schedule(self, msg: Message, deliver_at_ms: int) -> Message:
        return self.scheduler.prepare(msg, deliver_at_ms)

    def scheduled(self, level: int) -> None:
        self.scheduler.notify(level)

    def ensure_system_topic(self, name: str, queues: int) -> None:
        self.topics.ensure_system(name, queues)
