"""The fault campaign: scenarios run one after the other, each in a world of its own (a broker,
the orders and billing services, their databases), then settled, checked and reconciled.

    figures = await run_campaign(CampaignOptions(scenarios=("broker-kill",), sizes=Sizes(3)))

Everything runs on loopback, in a temporary folder removed afterwards (kept when a scenario is
not clean, for inspection, or with ``keep``); every wait is bounded and every process started
is stopped, also when a scenario fails half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from txbroker.chaos.catalogue import SCENARIO_HELP
from txbroker.chaos.dbrestart import postgres_restart, private_postgres
from txbroker.chaos.diskfull import disk_full, small_disk
from txbroker.chaos.failover import async_cluster, check_tails, master_failover, sync_cluster
from txbroker.chaos.figures import Figures
from txbroker.chaos.network import network_faults, proxied
from txbroker.chaos.scenarios import Sizes, Skip, broker_kill, broker_stop, service_kill
from txbroker.chaos.spark import Reconciler
from txbroker.chaos.world import World, WorldSpec

__all__ = ["SCENARIOS", "CampaignOptions", "Scenario", "run_campaign"]

Run = Callable[[World, Sizes, Figures], Awaitable[None]]
LIFETIME_MARGIN_S: Final = 300.0  # starting, settling and reconciling after the rounds
# A scenario's setting: given its folder, the world's spec (after setting up what it needs,
# torn down when the context ends), or a reason it cannot run here (Skip).
Setting = Callable[[Path, Sizes, Figures], contextlib.AbstractAsyncContextManager[WorldSpec]]


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Run
    setting: Setting | None = None  # None: SQLite databases, the broker's data in the folder
    # Checks of the scenario's own, after the world's (before the reconciliation).
    after: Callable[[World, Figures], Awaitable[None]] | None = None

    @property
    def help(self) -> str:
        return SCENARIO_HELP[self.name]


@contextlib.asynccontextmanager
async def _plain(root: Path, _sizes: Sizes, _f: Figures) -> AsyncIterator[WorldSpec]:
    yield WorldSpec(root)


def _registry() -> dict[str, Scenario]:
    scenarios = [
        Scenario("broker-kill", broker_kill),
        Scenario("service-kill", service_kill),
        Scenario("broker-stop", broker_stop),
        Scenario("network", network_faults, proxied),
        Scenario("postgres-restart", postgres_restart, private_postgres),
        Scenario("disk-full", disk_full, small_disk),
        Scenario("master-failover", master_failover, sync_cluster, check_tails),
        Scenario("master-failover-async", master_failover, async_cluster, check_tails),
    ]
    # The catalogue is what the command line offers: the same scenarios, in the same order.
    assert [s.name for s in scenarios] == list(SCENARIO_HELP), "catalogue.py is out of step"
    return {s.name: s for s in scenarios}


SCENARIOS: Final = _registry()


@dataclass(frozen=True)
class CampaignOptions:
    """``reconcile``: None runs Spark when it is present, True requires it, False skips it.
    ``spark``: a session to share (the tests'). ``on_done``: called with each scenario's row
    as it finishes (the command line prints progress with it)."""

    scenarios: tuple[str, ...] = tuple(SCENARIOS)
    sizes: Sizes = field(default_factory=Sizes)
    root: Path | None = None
    keep: bool = False
    reconcile: bool | None = None
    seed: int | None = None
    spark: Any = None
    on_done: Callable[[Figures], None] | None = None


async def run_campaign(opts: CampaignOptions) -> list[Figures]:
    unknown = [s for s in opts.scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    seed = opts.seed if opts.seed is not None else random.randrange(2**32)
    root = Path(tempfile.mkdtemp(prefix="txb-chaos-", dir=opts.root))
    reconciler: Reconciler | None = None
    why_not = "off" if opts.reconcile is False else await asyncio.to_thread(Reconciler.unavailable)
    if why_not is None:
        reconciler = Reconciler(opts.spark)
    elif opts.reconcile:
        raise RuntimeError(f"the reconciliation cannot run: {why_not}")
    rows: list[Figures] = []
    try:
        for i, name in enumerate(opts.scenarios):
            rng = random.Random(seed + i)
            f = await _run_one(SCENARIOS[name], root / name, opts.sizes, rng, reconciler, why_not)
            f.notes.insert(0, f"seed {seed + i}")
            rows.append(f)
            if opts.on_done is not None:
                opts.on_done(f)
    finally:
        if reconciler is not None:
            await asyncio.to_thread(reconciler.close)
        if opts.keep or not all(r.clean for r in rows):
            for r in rows:
                r.notes.append(f"files kept in {root / r.scenario}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return rows


async def _run_one(
    scenario: Scenario,
    root: Path,
    sizes: Sizes,
    rng: random.Random,
    reconciler: Reconciler | None,
    why_not: str | None,
) -> Figures:
    f = Figures(scenario.name)
    started = time.monotonic()
    setting = scenario.setting or _plain
    try:
        async with contextlib.AsyncExitStack() as stack:
            spec = await stack.enter_async_context(setting(root, sizes, f))
            # A service stops by itself once the scenario must be over: a campaign that lost
            # track of it must not leave it running.
            spec.settle_s = sizes.settle_s
            spec.lifetime_s = sizes.max_s + spec.settle_s + LIFETIME_MARGIN_S
            world = await stack.enter_async_context(World(spec))
            world.rng = rng
            await scenario.run(world, sizes, f)
            await world.settle_and_check(f)
            if scenario.after is not None:
                await scenario.after(world, f)
            logs = await world.logs()
            if isinstance(logs, dict):
                f.logs = {g: str(p) for g, p in logs.items()}
            if reconciler is not None:
                f.reconciled, n = await asyncio.to_thread(
                    reconciler.run, world.orders_url, world.billing_url, logs, root / "reconcile"
                )
                f.anomalies += n
            else:
                f.reconciled = f"not run: {why_not}"
    except Skip as e:
        f.reconciled = "skipped"
        f.notes.append(f"skipped: {e}")
    except Exception as e:
        f.anomalies += 1
        f.notes.append(f"failed: {type(e).__name__}: {e}")
    f.seconds = time.monotonic() - started
    return f
