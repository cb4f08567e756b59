"""Drive orders into the orders service like a client that keeps its promises: each order has
its own id and is retried until the service gives a definite answer, so a service killed in
the middle of a request costs a retry, never an order the client believes in but nobody has.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

__all__ = ["Outcome", "drive"]

ITEMS = [f"sku-{i:02d}" for i in range(20)]
GIVE_UP_S = 120.0  # one order retried this long means the service is not coming back


@dataclass
class Outcome:
    placed: set[str] = field(default_factory=set)  # 201, or 409 on a retry: it is committed
    declined: set[str] = field(default_factory=set)  # 422: a business rule said no
    retries: int = 0  # requests repeated after a dropped connection or a 503
    elapsed_s: float = 0.0


class Progress:
    """A progress bar on a terminal; a line per tenth elsewhere (CI logs stay readable)."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.tty = sys.stderr.isatty()
        self._next_line = 0
        self._start = time.monotonic()

    def update(self, done: int, extra: str = "") -> None:
        rate = done / max(time.monotonic() - self._start, 1e-9)
        if self.tty:
            filled = int(30 * done / self.total)
            bar = "#" * filled + "-" * (30 - filled)
            sys.stderr.write(
                f"\r  [{bar}] {done:>6}/{self.total} {self.label} {rate:6.0f}/s {extra}\x1b[K"
            )
            if done == self.total:
                sys.stderr.write("\n")
        elif done >= self._next_line or done == self.total:
            sys.stderr.write(f"  {done:>6}/{self.total} {self.label} ({rate:.0f}/s) {extra}\n")
            self._next_line = done + max(self.total // 10, 1)
        sys.stderr.flush()


async def drive(
    base_url: str,
    orders: int,
    *,
    concurrency: int = 8,
    decline_rate: float = 0.03,
    status: Callable[[], str] = lambda: "",
) -> Outcome:
    out = Outcome()
    progress = Progress(orders, "orders")
    todo: asyncio.Queue[int] = asyncio.Queue()
    for i in range(orders):
        todo.put_nowait(i)
    done = 0
    start = time.monotonic()

    async def place(http: httpx.AsyncClient, i: int) -> None:
        oid = f"order-{i:06d}"
        order = {
            "id": oid,
            "item": random.choice(ITEMS),
            "qty": 0 if random.random() < decline_rate else random.randint(1, 3),
            "amount_cents": random.randint(100, 10_000),
        }
        deadline = time.monotonic() + GIVE_UP_S
        first = True
        while True:
            if not first:
                out.retries += 1
            first = False
            try:
                res = await http.post("/orders", json=order)
            except httpx.TransportError:
                code = 0  # the service died or is restarting: the outcome is unknown
            else:
                code = res.status_code
            if code in (201, 409):  # 409 on a retry: the first attempt committed
                out.placed.add(oid)
                return
            if code == 422:
                out.declined.add(oid)
                return
            if code not in (0, 503):
                raise RuntimeError(f"order {order['id']}: unexpected HTTP {code}: {res.text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"order {order['id']}: no answer for {GIVE_UP_S:.0f} s")
            await asyncio.sleep(random.uniform(0.05, 0.3))  # back off before the retry

    async def worker(http: httpx.AsyncClient) -> None:
        nonlocal done
        while not todo.empty():
            await place(http, todo.get_nowait())
            done += 1
            progress.update(done, status())

    async with httpx.AsyncClient(base_url=base_url, timeout=30.0) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    out.elapsed_s = time.monotonic() - start
    return out
