"""The topic registry: which topics exist and how many queues each has. Persisted atomically
in ``<data>/meta/topics.json``; auto-creation is off by default, so a typo in a producer's topic
name is an error, not a new topic."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import InvalidArgument, NotFound, TopicExists
from txbroker.protocol.names import validate_topic
from txbroker.store.atomicfile import write_atomic

__all__ = ["MAX_QUEUES", "Topic", "TopicRegistry"]

# Queues are the unit of ordering and of consumer parallelism; 256 is far more consumers per
# group than one broker serves, and keeps per-topic files and memory bounded.
MAX_QUEUES: Final = 256
FILE: Final = "topics.json"


class Topic(msgspec.Struct, frozen=True):
    name: str
    queues: int
    created_ms: int
    system: bool = False


class TopicRegistry:
    def __init__(self, meta_dir: Path) -> None:
        self._dir = meta_dir
        self._topics: dict[str, Topic] = {}

    def load(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / FILE
        if path.exists():
            topics = msgspec.json.decode(path.read_bytes(), type=list[Topic])
            self._topics = {t.name: t for t in topics}

    def _commit(self, topics: dict[str, Topic]) -> None:
        """Write the new registry, then adopt it: a failed write leaves memory as the disk is.
        (An fsync on the event loop, but topic changes are rare admin operations.)"""
        write_atomic(self._dir / FILE, msgspec.json.encode(sorted(topics.values(), key=_name)))
        self._topics = topics

    def create(self, name: str, queues: int, *, system: bool = False) -> Topic:
        validate_topic(name, allow_system=system)
        if type(queues) is not int or not 1 <= queues <= MAX_QUEUES:
            raise InvalidArgument(f"queue count must be 1..{MAX_QUEUES}, not {queues!r}")
        existing = self._topics.get(name)
        if existing is not None:
            if existing.queues == queues:
                return existing  # creating what exists, identically, is a no-op
            raise TopicExists(f"topic {name!r} exists with {existing.queues} queues")
        topic = Topic(name, queues, time.time_ns() // 1_000_000, system)
        self._commit({**self._topics, name: topic})
        return topic

    def ensure_system(self, name: str, queues: int = 1) -> Topic:
        return self._topics.get(name) or self.create(name, queues, system=True)

    def get(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            validate_topic(name)
            raise NotFound(f"topic {name!r} does not exist (create it first)")
        return topic

    def delete(self, name: str) -> Topic:
        topic = self.get(name)
        if topic.system:
            raise InvalidArgument(f"topic {name!r} belongs to the broker")
        self._commit({k: v for k, v in self._topics.items() if k != name})
        return topic

    def list(self, *, include_system: bool = False) -> list[Topic]:
        return sorted(
            (t for t in self._topics.values() if include_system or not t.system), key=_name
        )


def _name(t: Topic) -> str:
    return t.name
