"""Long polling: a pull that finds nothing waits here until a message lands in one of its
queues or its hold time runs out. Waiters are per (topic, queue); a notification wakes every
pull waiting on that queue, which then re-reads (cheap: the consume queue is in memory)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

__all__ = ["Notifier", "Watch"]

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

    def watch(self, keys: Iterable[QueueKey]) -> Watch:
        """Register interest *before* reading the queues, so a message appended while the read
        is in progress still wakes the waiter (no lost wake-up between read and wait)."""
        return Watch(self, list(keys))

    async def wait(self, keys: Iterable[QueueKey], timeout_s: float) -> bool:
        """Wait until any of ``keys`` is notified (True) or ``timeout_s`` passes (False)."""
        with self.watch(keys) as w:
            return await w.wait(timeout_s)

    def _add(self, keys: list[QueueKey], fut: asyncio.Future[None]) -> None:
        for k in keys:
            self._waiters.setdefault(k, set()).add(fut)

    def _remove(self, keys: list[QueueKey], fut: asyncio.Future[None]) -> None:
        for k in keys:
            ws = self._waiters.get(k)
            if ws is not None:
                ws.discard(fut)
                if not ws:
                    del self._waiters[k]

    def wake_all(self) -> None:
        """Wake every waiter (shutdown: held pulls answer now instead of after their hold)."""
        waiters, self._waiters = self._waiters, {}
        for ws in waiters.values():
            for fut in ws:
                if not fut.done():
                    fut.set_result(None)

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiters.values())


class Watch:
    def __init__(self, notifier: Notifier, keys: list[QueueKey]) -> None:
        self._n = notifier
        self._keys = keys
        self._fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __enter__(self) -> Watch:
        self._n._add(self._keys, self._fut)
        return self

    def __exit__(self, *exc: object) -> None:
        self._n._remove(self._keys, self._fut)

    @property
    def fired(self) -> bool:
        return self._fut.done()

    async def wait(self, timeout_s: float) -> bool:
        if self._fut.done():
            return True
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # races the inner future's completion, leaving the task unstoppable.
            async with asyncio.timeout(max(timeout_s, 0)):
                await asyncio.shield(self._fut)
            return True
        except TimeoutError:
            return False
