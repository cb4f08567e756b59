"""Ordered lanes: run work items in parallel across lanes, one at a time within a lane.

    lanes = Lanes(handle, concurrency=4, capacity=16)
    await lanes.room()            # back-pressure: wait until fewer than `capacity` are admitted
    lanes.submit(lane_key, item)  # FIFO within its lane; at most `concurrency` run at once
    await lanes.close(30.0)       # drop what has not started, let the rest finish (bounded)

A lane exists while it has items: its task runs them in order and ends when it runs dry, so
idle lanes (one per queue or per message key) cost nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["Lanes", "LanesState"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class LanesState(enum.Enum):
    OPEN = "open"  # admitting and starting items
    DRAINING = "draining"  # close() called: nothing new starts, running items may finish
    CLOSED = "closed"


class Lanes(Generic[T]):
    def __init__(
        self,
        work: Callable[[T], Awaitable[None]],
        *,
        concurrency: int,
        capacity: int,
        gate: asyncio.Lock | None = None,
    ) -> None:
        """``gate``, when given, is held around each item as well (shared with other Lanes),
        for a resource that admits one user at a time whatever the concurrency."""
        self._work = work
        self._slots = asyncio.Semaphore(concurrency)
        self._gate = gate
        self._capacity = capacity
        self._queues: dict[Hashable, deque[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._admitted = 0  # queued + running
        self._room = asyncio.Event()
        self._room.set()
        self.state = LanesState.OPEN

    @property
    def admitted(self) -> int:
        return self._admitted

    async def room(self) -> None:
        """Return once fewer than ``capacity`` items are admitted."""
        await self._room.wait()

    def submit(self, lane: Hashable, item: T) -> None:
        if self.state is not LanesState.OPEN:
            raise RuntimeError(f"lanes are {self.state.value}")
        self._admit(1)
        queue = self._queues.get(lane)
        if queue is not None:
            queue.append(item)  # its lane task is running and will get to it
            return
        self._queues[lane] = deque([item])
        task = asyncio.create_task(self._drive(lane))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, timeout_s: float) -> None:
        """Start nothing new (queued items are dropped), wait up to ``timeout_s`` for running
        items, then cancel what is still running."""
        if self.state is LanesState.CLOSED:
            return
        self.state = LanesState.DRAINING
        try:
            tasks = set(self._tasks)
            if tasks:
                _, late = await asyncio.wait(tasks, timeout=timeout_s)
                for t in late:
                    t.cancel()
                if late:
                    log.warning(
                        "%d handler(s) still running after %.1f s: cancelled", len(late), timeout_s
                    )
                    await asyncio.gather(*late, return_exceptions=True)
        finally:
            # Also reached when close() itself is cancelled: no lane task may outlive us.
            for t in self._tasks:
                t.cancel()
            self.state = LanesState.CLOSED

    async def _drive(self, lane: Hashable) -> None:
        queue = self._queues[lane]
        try:
            while queue and self._open():
                async with self._slots, self._gate or contextlib.nullcontext():
                    # Waiting for a slot may have outlasted the open state: check again, so
                    # nothing starts after close() began.
                    if not self._open():
                        break
                    item = queue.popleft()
                    try:
                        await self._work(item)
                    except Exception:
                        log.exception("work item failed in lane %r", lane)
                    finally:
                        self._admit(-1)
        finally:
            # Dropped items were never started: the caller treats them as not done.
            self._admit(-len(queue))
            queue.clear()
            if self._queues.get(lane) is queue:
                del self._queues[lane]

    def _open(self) -> bool:
        return self.state is LanesState.OPEN

    def _admit(self, n: int) -> None:
        self._admitted += n
        if self._admitted < self._capacity:
            self._room.set()
        else:
            self._room.clear()
