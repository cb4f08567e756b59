"""Back-checks by pull: the due checks of services that cannot be called, held for their pollers.

A transaction prepared with ``check_url`` = :data:`PULL_CHECK_URL` is checked like any other
(same due times, backoff, counting and parking, ``checker.py``), but its check is not sent: it
waits in its producer group's queue until a poller of that group takes it. A check taken is
*out* until the poller answers it (commit, rollback or unknown) or its answer window
(the checker's ``deadline_ms``, as for a check sent over HTTP) ends, which counts as a check
that timed out. Pure bookkeeping over transaction ids, plus the futures pollers wait on: the
transactions themselves, and when each is due, stay the coordinator's and the checker's, so a
restart re-derives every due check from the log and ``tx.json`` and loses only which were out.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["PULL_CHECK_URL", "PullQueues", "PulledCheck"]

# The check_url that asks for back-checks by pull: not a URL, so no PREPARE could mean an
# endpoint by it, and short enough to store with every half record of such a service.
PULL_CHECK_URL: Final = "pull"


@dataclass(frozen=True, slots=True)
class PulledCheck:
    """A check a poller took and has not answered yet."""

    due_ms: int  # when its answer window ends: the transaction's next_check_ms meanwhile
    taken_s: float  # monotonic seconds when it was taken (the check's latency is from here)


class PullQueues:
    """Due checks per producer group, waiting for a poller; the checks out with pollers."""

    def __init__(self) -> None:
        self._queues: dict[str, deque[str]] = {}
        self._out: dict[str, PulledCheck] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}

    def clear(self) -> None:
        """Forget everything (the checker starts again, after a failover): due checks are
        queued anew from the transactions' due times."""
        self._queues.clear()
        self._out.clear()
        self.wake_all()

    def push(self, group: str, tx_id: str) -> None:
        """``tx_id``'s check is due: queue it for ``group``'s pollers and wake them."""
        self._queues.setdefault(group, deque()).append(tx_id)
        for w in self._waiters.get(group, ()):
            if not w.done():
                w.set_result(None)

    def take(
        self, group: str, n: int, live: Callable[[str], bool], visible: Callable[[str], bool]
    ) -> list[str]:
        """Up to ``n`` queued checks of ``group`` that ``visible`` lets this poller see, oldest
        first. Those ``live`` rejects (ended, parked, out, or due later by now) are dropped;
        those the poller may not see stay queued for another."""
        q = self._queues.get(group)
        if not q:
            return []
        got: list[str] = []
        kept: deque[str] = deque()
        while q and len(got) < n:
            tx_id = q.popleft()
            if not live(tx_id):
                continue
            (got if visible(tx_id) else kept).append(tx_id)
        kept.extend(q)
        if kept:
            self._queues[group] = kept
        else:
            del self._queues[group]
        return got

    async def wait(self, group: str, timeout_s: float) -> None:
        """Until a check of ``group`` is queued, the queues are cleared, or ``timeout_s``."""
        w: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(group, set())
        waiters.add(w)
        try:
            async with asyncio.timeout(timeout_s):
                await w
        except TimeoutError:
            pass
        finally:
            waiters.discard(w)
            if not waiters:
                del self._waiters[group]

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    # --- checks out with pollers ---

    def taken(self, tx_id: str, check: PulledCheck) -> None:
        self._out[tx_id] = check

    def out(self, tx_id: str) -> PulledCheck | None:
        return self._out.get(tx_id)

    def answered(self, tx_id: str) -> PulledCheck | None:
        """The check out for ``tx_id``, no longer out; None if none was."""
        return self._out.pop(tx_id, None)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def out_count(self) -> int:
        return len(self._out)
