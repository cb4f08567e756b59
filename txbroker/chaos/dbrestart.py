"""A database restarted under the services: both services' databases on a private PostgreSQL
server (:class:`~txbroker.chaos.pgserver.PrivatePostgres`), stopped and started again round
after round while orders are placed, the relay publishes and the subscriber applies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from txbroker.chaos.figures import Figures
from txbroker.chaos.pgserver import PgUnavailable, PrivatePostgres
from txbroker.chaos.scenarios import Sizes, Skip, load_round, out_of_time
from txbroker.chaos.world import World, WorldSpec

__all__ = ["postgres_restart", "private_postgres"]


@contextlib.asynccontextmanager
async def private_postgres(root: Path, _sizes: Sizes, f: Figures) -> AsyncIterator[WorldSpec]:
    try:
        pg = PrivatePostgres()
    except PgUnavailable as e:
        raise Skip(f"no private PostgreSQL: {e}") from None
    await asyncio.to_thread(pg.__enter__)
    try:
        orders = await asyncio.to_thread(pg.create, "orders")
        billing = await asyncio.to_thread(pg.create, "billing")
        yield WorldSpec(root, orders_url=orders, billing_url=billing, postgres=pg)
        f.notes.append(f"PostgreSQL on 127.0.0.1:{pg.port}, restarted {pg.restarts} times")
    finally:
        await asyncio.to_thread(pg.__exit__)


async def postgres_restart(world: World, sizes: Sizes, f: Figures) -> None:
    """Each round the server goes down under load, in turn as after a crash (``immediate``: no
    checkpoint, recovery at the start) and cleanly (``fast``), and comes back. Meanwhile orders
    fail and are placed anew, check-backs answer 500 (UNKNOWN, asked again), the relay backs
    off and the subscriber's handler fails into its retries."""
    pg = world.spec.postgres
    assert pg is not None
    started = time.monotonic()
    for r in range(sizes.rounds):
        if out_of_time(started, sizes, f) or not await load_round(world, sizes, f):
            break
        await asyncio.to_thread(pg.restart, "immediate" if r % 2 == 0 else "fast")
        f.struck()
        f.rounds += 1
