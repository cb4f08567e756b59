"""Consumer groups: membership by heartbeat, queue assignment, generations, committed offsets.

Clustering mode: each queue of a topic belongs to one member at a time, assigned by average
allocation (:func:`allocate_average`). Every change of membership bumps the group's generation;
a member holding an older generation cannot commit offsets (its queues may already be someone
else's). Broadcast mode: every member gets every queue and keeps its own offsets (the group name
is qualified by the member id), so each member sees every message. Committed offsets persist in
``meta/offsets.json`` (atomic write, on change, coalesced).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import InvalidArgument, StaleGeneration
from txbroker.protocol.names import validate_topic
from txbroker.store.snapshot import Snapshot

__all__ = ["ConsumeMode", "GroupCoordinator", "allocate_average"]

OFFSETS_FILE: Final = "offsets.json"
# Room for the "%RETRY%" prefix of the group's retry topic within the 127-byte name limit.
MAX_GROUP_NAME: Final = 120


class ConsumeMode(enum.StrEnum):
    CLUSTERING = "clustering"
    BROADCAST = "broadcast"


def allocate_average(queues: int, members: list[str], member: str) -> list[int]:
    """Queues of ``member`` under average allocation over sorted ``members``.

    RocketMQ's AllocateMessageQueueAveragely: with q queues and m members, member i gets a
    contiguous run of q//m queues, the first q%m members one more."""
    ordered = sorted(members)
    if member not in ordered:
        return []
    i, m = ordered.index(member), len(ordered)
    base, extra = divmod(queues, m)
    start = i * base + min(i, extra)
    count = base + (1 if i < extra else 0)
    return list(range(start, start + count))


@dataclass
class _Group:
    topic: str
    queues: int
    mode: ConsumeMode
    generation: int = 0
    members: dict[str, float] = field(default_factory=dict)  # member id -> last heartbeat


class GroupCoordinator:
    def __init__(self, meta_dir: Path, *, session_timeout_ms: int = 10_000) -> None:
        self._dir = meta_dir
        self._session_s = session_timeout_ms / 1000
        self._groups: dict[tuple[str, str], _Group] = {}
        # (group, topic) -> {queue_id: next offset to consume}
        self._offsets: dict[str, dict[str, dict[int, int]]] = {}
        self.snapshot = Snapshot(
            meta_dir / OFFSETS_FILE, lambda: msgspec.json.encode(self._offsets)
        )

    # --- persistence ---

    def load(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        path = self._dir / OFFSETS_FILE
        if path.exists():
            raw = msgspec.json.decode(path.read_bytes(), type=dict[str, dict[str, dict[int, int]]])
            self._offsets = raw

    # --- membership ---

    def heartbeat(
        self,
        group: str,
        topic: str,
        member: str,
        queues: int,
        mode: ConsumeMode,
        now: float | None = None,
    ) -> tuple[int, list[int]]:
        """Register or refresh ``member``; return (generation, its queues)."""
        validate_topic(group, allow_system=False)
        if len(group) > MAX_GROUP_NAME:
            raise InvalidArgument(
                f"group name is {len(group)} characters; the limit is {MAX_GROUP_NAME} (the "
                "group's retry and dead-letter topics add a prefix to it)"
            )
        if not member:
            raise InvalidArgument("member id must not be empty")
        now = time.monotonic() if now is None else now
        g = self._groups.get((group, topic))
        if g is None or g.queues != queues or g.mode != mode:
            g = self._groups[(group, topic)] = _Group(
                topic, queues, mode, (g.generation + 1) if g else 1
            )
        self._expire(g, now)
        if member not in g.members:
            g.generation += 1
        g.members[member] = now
        return g.generation, self.assignment(g, member)

    def leave(self, group: str, topic: str, member: str) -> None:
        g = self._groups.get((group, topic))
        if g is not None and g.members.pop(member, None) is not None:
            g.generation += 1

    def expire_all(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for g in self._groups.values():
            self._expire(g, now)

    def _expire(self, g: _Group, now: float) -> None:
        dead = [m for m, seen in g.members.items() if now - seen > self._session_s]
        for m in dead:
            del g.members[m]
        if dead:
            g.generation += 1

    def assignment(self, g: _Group, member: str) -> list[int]:
        if g.mode is ConsumeMode.BROADCAST:
            return list(range(g.queues)) if member in g.members else []
        return allocate_average(g.queues, list(g.members), member)

    def check(self, group: str, topic: str, member: str, generation: int) -> list[int]:
        """The member's queues if its generation is current, else StaleGeneration."""
        g = self._groups.get((group, topic))
        if g is None or member not in g.members or generation != g.generation:
            current = g.generation if g else 0
            raise StaleGeneration(
                f"member {member!r} of group {group!r} holds generation {generation}, the group "
                f"is at {current}: heartbeat again to learn the new assignment"
            )
        return self.assignment(g, member)

    def members(self, group: str, topic: str) -> dict[str, float]:
        g = self._groups.get((group, topic))
        return dict(g.members) if g else {}

    def offset_owner(self, group: str, topic: str, member: str) -> str:
        """The key offsets are kept under: the group, or group@member in broadcast mode."""
        g = self._groups.get((group, topic))
        return f"{group}@{member}" if g is not None and g.mode is ConsumeMode.BROADCAST else group

    # --- offsets ---

    def committed(self, owner: str, topic: str, queue_id: int) -> int | None:
        return self._offsets.get(owner, {}).get(topic, {}).get(queue_id)

    def commit(self, owner: str, topic: str, queue_id: int, offset: int) -> None:
        if offset < 0:
            raise InvalidArgument("offsets are non-negative")
        per_topic = self._offsets.setdefault(owner, {}).setdefault(topic, {})
        if per_topic.get(queue_id) != offset:
            per_topic[queue_id] = offset
            self.snapshot.mark()

    def all_offsets(self) -> dict[str, dict[str, dict[int, int]]]:
        """Every committed offset (owner -> topic -> queue -> offset), a copy: what a master
        sends its slaves (replication)."""
        return {o: {t: dict(qs) for t, qs in ts.items()} for o, ts in self._offsets.items()}

    def adopt_offsets(
        self,
        offsets: dict[str, dict[str, dict[int, int]]],
        exists: Callable[[str], bool],
        queue_end: Callable[[str, int], int],
    ) -> None:
        """A slave takes its master's committed offsets (topics it has) as they are, backwards
        too: a group's offsets are its master's (a slave refuses commits), and one the slave
        kept from a term of its own as master may lie past records its log no longer holds
        the same way. Never past the end of its own queue: entries the master has and the
        slave not yet may never be the group's (a failover before they are copied), and the
        entries written there instead must not be skipped."""
        for owner, topics in offsets.items():
            for topic, queues in topics.items():
                if not exists(topic):
                    continue
                for qid, off in queues.items():
                    self.commit(owner, topic, qid, max(min(off, queue_end(topic, qid)), 0))

    def clamp_offsets(self, queue_end: Callable[[str, int], int]) -> None:
        """No committed offset past its queue's end: after a tail was cut from the log, the
        entries a later master writes there are the group's to read."""
        for owner, topics in self._offsets.items():
            for topic, queues in topics.items():
                for qid, off in queues.items():
                    end = queue_end(topic, qid)
                    if off > end:
                        self.commit(owner, topic, qid, end)

    def drop_topic(self, topic: str) -> None:
        """A deleted topic: forget every group's offsets in it, and end its memberships with a
        new generation, so a member still pulling or acknowledging is told to join again (and
        joins the topic created again under the name, if any, from its start)."""
        for per_topic in self._offsets.values():
            if per_topic.pop(topic, None) is not None:
                self.snapshot.mark()
        self._offsets = {o: t for o, t in self._offsets.items() if t}
        for (_, name), g in self._groups.items():
            if name == topic:
                g.members.clear()
                g.generation += 1

    def prune(self, exists: Callable[[str], bool]) -> None:
        """At start: forget offsets in topics that do not exist (deleted while a crash kept the
        offsets file from being rewritten)."""
        for topic in {t for _, t in self.groups() if not exists(t)}:
            self.drop_topic(topic)

    def groups(self) -> list[tuple[str, str]]:
        """(owner, topic) pairs with committed offsets."""
        return [(o, t) for o, topics in self._offsets.items() for t in topics]

    def live(self) -> list[tuple[str, str]]:
        """(owner, topic) pairs of groups with live members, owners named as their offsets are
        kept (see ``offset_owner``): so a group shows before its first commit."""
        out: list[tuple[str, str]] = []
        for (group, topic), g in self._groups.items():
            if g.mode is ConsumeMode.BROADCAST:
                out += [(f"{group}@{m}", topic) for m in g.members]
            elif g.members:
                out.append((group, topic))
        return out
