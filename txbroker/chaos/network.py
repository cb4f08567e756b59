"""Network faults between the services and the broker: the services and the plain producer
connect through a :class:`~txbroker.chaos.proxy.FaultProxy`, which in turn adds latency,
resets every open connection, or truncates the next chunk of each (checks, admin requests and
back-checks go around it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from txbroker.chaos.figures import Figures
from txbroker.chaos.procs import free_port
from txbroker.chaos.proxy import FaultProxy
from txbroker.chaos.scenarios import Sizes, load_round, out_of_time
from txbroker.chaos.world import World, WorldSpec

__all__ = ["network_faults", "proxied"]

# Latency added to every chunk during a latency round: up to half the clients' 5 s request
# timeout over a request's two chunks, so requests slow down without timing out.
LATENCY_S: Final = (0.02, 0.5)
KINDS: Final = ("latency", "reset", "truncate")


@contextlib.asynccontextmanager
async def proxied(root: Path, _sizes: Sizes, f: Figures) -> AsyncIterator[WorldSpec]:
    port = free_port()
    async with FaultProxy(port) as proxy:
        yield WorldSpec(root, broker_port=port, service_url=proxy.url, proxy=proxy)
        f.notes.append(
            f"{proxy.connections} connections through the proxy, {proxy.resets} reset, "
            f"{proxy.truncations} truncated"
        )


async def network_faults(world: World, sizes: Sizes, f: Figures) -> None:
    """Round by round, in turn: a stretch of latency on every chunk, a RST of every open
    connection, a cut in the next chunk of every open connection. A fault counts once per
    latency stretch and once per connection reset or armed for a cut."""
    proxy = world.spec.proxy
    assert proxy is not None
    proxy.rng = world.rng
    started = time.monotonic()
    for r in range(sizes.rounds):
        if out_of_time(started, sizes, f):
            break
        kind = KINDS[r % len(KINDS)]
        if kind == "latency":
            proxy.latency_s = world.rng.uniform(*LATENCY_S)
            try:
                progressed = await load_round(world, sizes, f)
            finally:
                proxy.latency_s = 0.0
            f.struck()
        else:
            progressed = await load_round(world, sizes, f)
            f.struck(proxy.reset() if kind == "reset" else proxy.truncate())
        if not progressed:
            break
        f.rounds += 1
