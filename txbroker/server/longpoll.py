"""Long polling: a pull that finds nothing waits here until a message lands in one of its
queues or its hold time runs out. Waiters are per (topic, queue); a notification wakes every
pull waiting on that queue, which then re-reads (cheap: the consume queue is in memory)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["Notifier"]

QueueKey = tuple[str, int]


class Notifier:
    def __init__(self) -> None:
        self._waiters: dict[QueueKey, set[asyncio.Future[None]]] = {}

    def notify(self, topic: str, queue_id: int) -> None:
        waiters = self._waiters.pop((topic, queue_id), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait(self, keys: Iterable[QueueKey], timeout_s: float) -> bool:
        """Wait until any of ``keys`` is notified (True) or ``timeout_s`` passes (False)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        keys = list(keys)
        for k in keys:
            self._waiters.setdefault(k, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            for k in keys:
                ws = self._waiters.get(k)
                if ws is not None:
                    ws.discard(fut)
                    if not ws:
                        del self._waiters[k]

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())
