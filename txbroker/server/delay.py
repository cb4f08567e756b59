"""Delayed delivery at an arbitrary time, with bounded memory and exactly-once hand-over.

A delayed message waits in the internal ``%SCHEDULE`` topic, in the queue of a *delay level*,
so due times rise along each queue and one cursor per level is all the state there is
(RocketMQ's schedule-topic idea, with a cascade for arbitrary times). Exactly once: every move
carries a deterministic internal key ``<level>:<offset>`` of the copy it came from, so after a
crash a copy already moved is found by its key and not moved again. :class:`DelayScheduler`
says how a message moves between levels.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from txbroker.errors import InvalidArgument
from txbroker.server.topics import TopicRegistry
from txbroker.store import (
    PROP_INTERNAL_KEY,
    PROP_TARGET_TOPIC,
    KeyKind,
    Message,
    MessageStore,
    StoredMessage,
)
from txbroker.store.snapshot import Snapshot

__all__ = ["LEVELS_MS", "MAX_DELAY_MS", "SCHEDULE_TOPIC", "DelayScheduler"]

log = logging.getLogger(__name__)

SCHEDULE_TOPIC: Final = "%SCHEDULE"
# Roughly doubling steps from 100 ms to 16 days: a delay of d takes about log2(d / 100 ms)
# moves at most, and the last move lands within 100 ms of the target time.
LEVELS_MS: Final = (
    100, 250, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    1_200_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000, 28_800_000, 57_600_000, 86_400_000,
    172_800_000, 345_600_000, 691_200_000, 1_382_400_000,
)  # fmt: skip
# 30 days: beyond that a "delay" is a workflow, not a message; refusing keeps levels bounded.
MAX_DELAY_MS: Final = 30 * 86_400_000
PROP_DELIVER_AT: Final = "dt"
PROP_TARGET_QUEUE: Final = "tq"
CURSORS_FILE: Final = "schedule.json"
# When the head of a level is not due yet, sleep at most this long before looking again, so a
# clock step or a missed notification costs little.
MAX_NAP_S: Final = 1.0


def level_for(remaining_ms: int) -> int:
    """Index of the largest level not longer than ``remaining_ms`` (the smallest if none)."""
    return max(bisect.bisect_right(LEVELS_MS, remaining_ms) - 1, 0)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DelayScheduler:
    """Moves delayed messages through the delay levels and delivers them when due.

    A message goes to the largest level not longer than its remaining delay. Every message in a
    level's queue waits the same time after being stored, so due times rise along the queue. When
    a level's head is due, the scheduler either delivers it (its time has come) or moves it to the
    level that fits what remains. Each move takes O(1) and a message makes O(log(delay)) moves,
    landing within one smallest level (100 ms) of its time. After a crash the scheduler resumes
    from its last saved cursor.
    """

    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        meta_dir: Path,
        on_delivered: Callable[[str, int], None],
    ) -> None:
        self._store = store
        self._topics = topics
        self._path = meta_dir / CURSORS_FILE
        self._on_delivered = on_delivered
        self._cursors: dict[int, int] = {}
        self.snapshot = Snapshot(self._path, lambda: msgspec.json.encode(self._cursors))
        self._wake: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.moved = 0
        self.delivered = 0

    def load(self) -> None:
        self._topics.ensure_system(SCHEDULE_TOPIC, len(LEVELS_MS))
        if self._path.exists():
            self._cursors = msgspec.json.decode(self._path.read_bytes(), type=dict[int, int])

    def forget_cursors(self) -> None:
        """Read every level from its first retained message again (a slave taking over: its
        cursors, if any, are from an earlier term); moves already made are found by their
        keys and not made twice."""
        self._cursors = {}

    def start(self) -> None:
        self._wake = {i: asyncio.Event() for i in range(len(LEVELS_MS))}
        self._tasks = [
            asyncio.create_task(self._run_level(i), name=f"txb-delay-{LEVELS_MS[i]}ms")
            for i in range(len(LEVELS_MS))
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.snapshot.save_async()

    def pending(self) -> int:
        """Messages waiting in all levels (some are in-between copies of one message)."""
        total = 0
        for i in range(len(LEVELS_MS)):
            lo, hi = self._store.queue_range(SCHEDULE_TOPIC, i)
            total += hi - max(self._cursors.get(i, lo), lo)
        return total

    # --- scheduling ---

    def prepare(self, msg: Message, deliver_at_ms: int) -> Message:
        """The ``%SCHEDULE`` copy of ``msg`` (to append in its place) for ``deliver_at_ms``."""
        remaining = deliver_at_ms - _now_ms()
        if remaining > MAX_DELAY_MS:
            raise InvalidArgument(
                f"delivery time is more than {MAX_DELAY_MS // 86_400_000} days away"
            )
        props = dict(msg.properties)
        props[PROP_DELIVER_AT] = str(deliver_at_ms)
        props[PROP_TARGET_TOPIC] = msg.topic
        props[PROP_TARGET_QUEUE] = str(msg.queue_id)
        return Message(SCHEDULE_TOPIC, msg.body, level_for(remaining), props, msg.flags)

    def notify(self, level: int) -> None:
        ev = self._wake.get(level)
        if ev is not None:
            ev.set()

    # --- the per-level loops ---

    async def _run_level(self, level: int) -> None:
        delay = LEVELS_MS[level]
        wake = self._wake[level]
        while True:
            wake.clear()  # before reading: a message appended meanwhile sets it again
            try:
                lo, _ = self._store.queue_range(SCHEDULE_TOPIC, level)
                cursor = max(self._cursors.get(level, lo), lo)
                got = await self._store.get_messages(SCHEDULE_TOPIC, level, cursor, 64)
                nap = MAX_NAP_S
                done: list[tuple[str, int]] = []  # (topic, queue) woken once durable
                # Where the cursor goes if every message read is handled: past the entries the
                # store skipped too (copies of deleted topics' messages).
                upto = got.next_offset
                for m in got.messages:
                    due = m.store_timestamp_ms + delay
                    now = _now_ms()
                    if due > now:
                        nap = min(nap, (due - now) / 1000)
                        upto = m.queue_offset
                        break
                    try:
                        done.append(await self._move(m, level))
                    except (KeyError, ValueError, InvalidArgument) as e:
                        # Not a well-formed schedule copy (only the broker writes this topic,
                        # so this is damage or a bug): skip it rather than block the level.
                        log.error(
                            "skipping malformed %s record %d/%d: %r",
                            SCHEDULE_TOPIC,
                            level,
                            m.queue_offset,
                            e,
                        )
                if upto > cursor:
                    # One group commit for the whole batch of moves, then the cursor: a burst of
                    # due messages costs one fsync, not one each.
                    durable = self._store.durable()
                    if durable is not None:
                        await durable
                    self._cursors[level] = upto
                    self.snapshot.mark()
                    for topic, queue_id in done:
                        if topic == SCHEDULE_TOPIC:
                            self.notify(queue_id)
                        elif topic:
                            self._on_delivered(topic, queue_id)
                    if upto == got.next_offset:
                        continue  # everything read was due: look again at once
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(nap):  # not wait_for: see longpoll.Watch.wait
                        await wake.wait()
            except asyncio.CancelledError:
                raise
            except Exception:  # keep the level alive; the next round retries the same head
                log.exception("delay level %d ms failed; retrying", delay)
                await asyncio.sleep(MAX_NAP_S)

    async def _move(self, m: StoredMessage, level: int) -> tuple[str, int]:
        """Append the next copy of ``m`` (to its target, or to the level that fits what
        remains) without waiting for durability; return where it went ("" if already moved)."""
        hop = f"{level}:{m.queue_offset}"
        if await self._store.lookup(KeyKind.INTERNAL, hop, limit=1):
            return ("", 0)  # moved before a crash; the cursor had not been saved yet
        if self._store.is_dead(m):
            return ("", 0)  # its topic was deleted while we looked: the copy dies with it
        props = dict(m.properties)
        props[PROP_INTERNAL_KEY] = hop
        deliver_at = int(props[PROP_DELIVER_AT])
        remaining = deliver_at - _now_ms()
        if remaining <= 0:  # never early; at most one smallest level (100 ms) late
            topic = props.pop(PROP_TARGET_TOPIC)
            queue_id = int(props.pop(PROP_TARGET_QUEUE))
            del props[PROP_DELIVER_AT]
            self._store.append_nowait(
                Message(topic, m.body, queue_id, props, m.flags, m.born_timestamp_ms)
            )
            self.delivered += 1
            return (topic, queue_id)
        nxt = level_for(remaining)
        self._store.append_nowait(
            Message(SCHEDULE_TOPIC, m.body, nxt, props, m.flags, m.born_timestamp_ms)
        )
        self.moved += 1
        return (SCHEDULE_TOPIC, nxt)
