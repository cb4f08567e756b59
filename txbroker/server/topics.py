"""The topic registry: which topics exist and how many queues each has, and the fences of
deleted ones. Persisted atomically in ``<data>/meta/topics.json``; auto-creation is off by
default, so a typo in a producer's topic name is an error, not a new topic.

A deletion writes the registry without the topic and with its fence (see
``txbroker.store.fences``) in one atomic write: that write is the deletion. After it, no restart
brings the topic's messages back; before it, the topic is whole.

Every creation and deletion bumps the registry's ``version`` (saved with it): a master's slaves
copy its topics when the version in a fetch answer is not the one they copied last
(``txbroker.server.replication``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import InvalidArgument, NotFound, TopicExists
from txbroker.protocol.names import validate_topic
from txbroker.store.atomicfile import write_atomic
from txbroker.store.fences import TopicFence

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


class _File(msgspec.Struct):
    """``topics.json`` since topic deletion fences (an earlier broker wrote the bare list)."""

    topics: list[Topic]
    deleted: dict[str, TopicFence] = msgspec.field(default_factory=dict)
    version: int = 0  # bumped by every creation and deletion (0: an earlier broker's file)


class TopicRegistry:
    def __init__(self, meta_dir: Path) -> None:
        self._dir = meta_dir
        self._topics: dict[str, Topic] = {}
        self._fences: dict[str, TopicFence] = {}
        self.version = 0  # see the module docstring
        # Called with the new version after a creation or deletion is on disk (the replication
        # master wakes its slaves' held fetches).
        self.on_change: Callable[[int], None] | None = None

    def load(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / FILE
        if path.exists():
            raw = path.read_bytes()
            if raw.lstrip().startswith(b"["):
                saved = _File(msgspec.json.decode(raw, type=list[Topic]))
            else:
                saved = msgspec.json.decode(raw, type=_File)
            self._topics = {t.name: t for t in saved.topics}
            self._fences = saved.deleted
            self.version = saved.version

    @property
    def fences(self) -> dict[str, TopicFence]:
        """Deleted topics' fences, for the store (a copy)."""
        return dict(self._fences)

    def _commit(
        self,
        topics: dict[str, Topic],
        fences: dict[str, TopicFence] | None = None,
        *,
        changed: bool = False,
    ) -> None:
        """Write the new registry, then adopt it: a failed write leaves memory as the disk is.
        (An fsync on the event loop, but topic changes are rare admin operations.) ``changed``:
        a topic was created or deleted (the version goes up)."""
        fences = self._fences if fences is None else fences
        version = self.version + 1 if changed else self.version
        saved = _File(sorted(topics.values(), key=_name), dict(sorted(fences.items())), version)
        write_atomic(self._dir / FILE, msgspec.json.encode(saved))
        self._topics = topics
        self._fences = fences
        self.version = version
        if changed and self.on_change is not None:
            self.on_change(version)

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
        self._commit({**self._topics, name: topic}, changed=True)
        return topic

    def exists(self, name: str) -> bool:
        return name in self._topics

    def ensure_system(self, name: str, queues: int = 1) -> Topic:
        return self._topics.get(name) or self.create(name, queues, system=True)

    def get(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            validate_topic(name)
            raise NotFound(f"topic {name!r} does not exist (create it first)")
        return topic

    def deletable(self, name: str) -> Topic:
        """The topic ``name`` if it exists and a user may delete it, else the error."""
        topic = self.get(name)
        if topic.system:
            raise InvalidArgument(f"topic {name!r} belongs to the broker")
        return topic

    def delete(self, name: str, fence: TopicFence | None = None) -> Topic:
        """Remove the topic and record its fence, in one durable write (see the docstring)."""
        topic = self.deletable(name)
        fences = self._fences if fence is None else {**self._fences, name: fence}
        self._commit({k: v for k, v in self._topics.items() if k != name}, fences, changed=True)
        return topic

    def follow_deletion(self, name: str, fence: TopicFence) -> Topic | None:
        """A slave takes its master's deletion of ``name``: without the topic (the one it
        held, if any; returned) and with the master's ``fence``, in one durable write."""
        topic = self._topics.get(name)
        assert topic is None or not topic.system, "a master never deletes a system topic"
        earlier = self._fences.get(name)
        fences = {**self._fences, name: earlier.merge(fence) if earlier is not None else fence}
        self._commit({k: v for k, v in self._topics.items() if k != name}, fences, changed=True)
        return topic

    def adopt_fences(self, fences: dict[str, TopicFence]) -> None:
        """Persist the store's fences when they differ (``Fences.clamp`` at open): before the
        broker appends anything."""
        if fences != self._fences:
            self._commit(self._topics, fences)

    def forget_fences(self, names: list[str]) -> None:
        """Drop fences the store no longer needs (``MessageStore.forget_fences``)."""
        if any(n in self._fences for n in names):
            self._commit(self._topics, {k: v for k, v in self._fences.items() if k not in names})

    def list(self, *, include_system: bool = False) -> list[Topic]:
        return sorted(
            (t for t in self._topics.values() if include_system or not t.system), key=_name
        )


def _name(t: Topic) -> str:
    return t.name
