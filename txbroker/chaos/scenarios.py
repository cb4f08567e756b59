"""The process faults: kill -9 of the broker, kill -9 of a service at its SDK's crash points,
SIGSTOP of the broker past the back-check timeout.

Each scenario runs its rounds in a started :class:`~txbroker.chaos.world.World` and counts them
into :class:`~txbroker.chaos.figures.Figures`; the world settles and checks afterwards. A round
lets the load run (``load`` more plain sends acknowledged and at least one more order placed),
then injects its fault at a random point of that load; a round that makes no progress within
``round_timeout_s`` ends the scenario with a note (that is a finding too).
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from typing import Final

from txbroker.chaos.figures import Figures
from txbroker.chaos.procs import Child
from txbroker.chaos.world import World

__all__ = [
    "CRASH_POINTS",
    "Sizes",
    "broker_kill",
    "broker_stop",
    "load_round",
    "out_of_time",
    "service_kill",
]

# Where a service dies (txbroker_sdk.faults): mid-@transactional before and after the database
# commit, mid-relay (published, not marked), mid-subscriber (committed, not acknowledged).
CRASH_POINTS: Final = (
    ("orders", "before_db_commit"),
    ("orders", "after_db_commit"),
    ("orders", "relay_after_send"),
    ("billing", "after_inbox_commit"),
)
# A point is armed to fire at a random pass up to this one: some rounds die at once, some later.
CRASH_PASS_MAX: Final = 8
# SIGSTOP holds the broker past tx_timeout_ms (1 s, world.BROKER_SETTINGS), so back-checks come
# due while it is stopped, and sometimes past the clients' request timeout (5 s), so requests
# in flight time out and their outcome is unknown to the service.
STOP_HOLD_S: Final = (1.2, 6.0)


class Skip(Exception):
    """The scenario cannot run on this machine (the reason is its message)."""


@dataclass(frozen=True)
class Sizes:
    """How much a scenario does: ``rounds`` faults, ``load`` plain sends between two of them,
    each round bounded by ``round_timeout_s`` and the scenario by ``max_s``."""

    rounds: int = 20
    load: int = 200
    round_timeout_s: float = 60.0
    max_s: float = 900.0
    settle_s: float = 90.0  # for everything to settle after the rounds, before the checks
    # How the disk-full scenario fills the disk: "tmpfs" (a small filesystem of its own, needs
    # root), "rlimit" (RLIMIT_FSIZE lowered on the broker: its writes fail with EFBIG), "auto"
    # (tmpfs when it can be mounted).
    disk: str = "auto"


async def load_round(world: World, sizes: Sizes, f: Figures) -> bool:
    """Let ``load`` more plain sends go and wait until a random part of them was acknowledged
    and an order was placed since: the moment to strike. False (with a note) if it stalled."""
    base = len(world.acked)
    placed = world.progress.get("orders.placed")
    await world.produce(sizes.load)
    cut = base + world.rng.randint(max(1, sizes.load // 4), max(1, sizes.load * 3 // 4))

    def ready() -> bool:
        return len(world.acked) >= cut and world.progress.get("orders.placed") > placed

    if await world.progress.wait_for(ready, sizes.round_timeout_s):
        return True
    f.notes.append(
        f"round {f.rounds + 1}: no progress in {sizes.round_timeout_s:.0f} s "
        f"({len(world.acked) - base} sends acknowledged, "
        f"{world.progress.get('orders.placed') - placed} orders placed)"
    )
    return False


def out_of_time(started: float, sizes: Sizes, f: Figures) -> bool:
    if time.monotonic() - started < sizes.max_s:
        return False
    f.notes.append(f"stopped after {f.rounds} rounds: the scenario's {sizes.max_s:.0f} s ran out")
    return True


async def broker_kill(world: World, sizes: Sizes, f: Figures) -> None:
    """kill -9 of the broker under plain sends, @transactional orders and the outbox relay,
    then a restart on the same ports (the services reconnect by themselves)."""
    started = time.monotonic()
    for _ in range(sizes.rounds):
        if out_of_time(started, sizes, f) or not await load_round(world, sizes, f):
            break
        await asyncio.to_thread(world.broker.kill)
        f.struck()
        await world.start_broker()
        f.rounds += 1


async def service_kill(world: World, sizes: Sizes, f: Figures) -> None:
    """kill -9 of a service at one of its crash points per round, in turn: mid-@transactional
    (before and after the database commit), mid-relay and mid-subscriber. The victim is
    restarted with the point armed at a random pass, dies there (SIGKILL, from inside: no
    ``finally`` runs), and is started again unarmed."""
    started = time.monotonic()
    for r in range(sizes.rounds):
        if out_of_time(started, sizes, f):
            break
        role, point = CRASH_POINTS[r % len(CRASH_POINTS)]
        victim = world.orders if role == "orders" else world.billing
        assert victim is not None
        await victim.stop()
        armed = f"{point}=@{world.rng.randint(1, CRASH_PASS_MAX)}"
        await _start(world, victim, armed)
        await world.produce(sizes.load)
        code = await victim.wait_exit(sizes.round_timeout_s)
        if code is None:
            f.notes.append(f"round {r + 1}: {role} never reached {point}; killed from outside")
            await victim.kill()
        elif code != -signal.SIGKILL:
            f.notes.append(f"round {r + 1}: {role} exited with {code} instead of dying at {point}")
        f.struck()
        await _start(world, victim, "")
        f.rounds += 1


async def _start(world: World, child: Child, faults: str) -> None:
    extra = world.orders_prefix() if child is world.orders else ()
    await child.start(faults, extra)


async def broker_stop(world: World, sizes: Sizes, f: Figures) -> None:
    """SIGSTOP of the broker under load for longer than the back-check timeout, then SIGCONT:
    checks come due all at once and requests in flight may time out at the client."""
    started = time.monotonic()
    for _ in range(sizes.rounds):
        if out_of_time(started, sizes, f) or not await load_round(world, sizes, f):
            break
        proc = world.broker.proc
        assert proc is not None
        proc.send_signal(signal.SIGSTOP)
        f.struck()
        try:
            # The fault is the time the broker stands still: a hold, not a synchronisation.
            await asyncio.sleep(world.rng.uniform(*STOP_HOLD_S))
        finally:
            proc.send_signal(signal.SIGCONT)
        f.rounds += 1
