"""Two-phase traffic across partitions: the fault campaign's world (:mod:`txbroker.chaos.world`)
against a partition group on test hosts (:mod:`txbroker.chaos.partitions`). The orders service
places ``@transactional`` orders (each with an outbox row) and answers back-checks, the billing
service applies every message once through its inbox, and a plain producer sends, all through
the NameServer from this machine (the nemesis's client host). One run: load, one partition of
:data:`~txbroker.chaos.nemesis.PARTITIONS` for a while, heal, load until orders are placed
again, stop the load and let everything settle (bounded); then the world's checks (every
acknowledged send, committed order and outbox row applied once, nothing rolled back applied,
every transaction decided, every outbox row published) and the transactions' checker
(:func:`~txbroker.chaos.history.check_transactions`) over the ``orders`` topic read back from
the group.

    async with partition_cluster(root, net, "sync", extra=broker_args(root)) as cluster:
        run = await run_services_partition(cluster, Nemesis(net), "halves", ServiceTiming(),
                                           root, orders_url, billing_url)

A run keeps what the Spark reconciliation needs afterwards (the databases' URLs and each group's
commit log as settled): a caller reconciles each run on its own, since every world has the same
topics and keys, and a pass over two of them would match one's messages with the other's rows.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from txbroker.chaos.cluster import Cluster
from txbroker.chaos.figures import Figures
from txbroker.chaos.history import TxReport, check_transactions
from txbroker.chaos.nemesis import PARTITIONS, Nemesis
from txbroker.chaos.partitions import (
    GROUP,
    GROUP_WHOLE_S,
    REQUEST_TIMEOUT_S,
    group_hosts,
    read_back,
)
from txbroker.chaos.service import GROUP as PRODUCER_GROUP
from txbroker.chaos.service import ORDERS
from txbroker.chaos.world import BROKER_SETTINGS, SECRET, World, WorldSpec

__all__ = ["ServiceRun", "ServiceTiming", "broker_args", "run_services_partition"]

# The services' first order and send: two interpreters importing SQLAlchemy and a first
# @transactional round trip through the NameServer, on a busy 2-core machine.
LOAD_START_S: Final = 60.0
PLAIN_PER_PHASE: Final = 200  # plain sends allowed in each phase: load, not a flood


@dataclass(frozen=True, slots=True)
class ServiceTiming:
    """How long each phase lasts, CI size by default (the cut outlasts the lease's 3 s TTL and
    an election); ``settle_s`` bounds the settling after the load stops."""

    before_s: float = 2.0
    during_s: float = 8.0
    after_s: float = 2.0
    settle_s: float = 60.0


@dataclass
class ServiceRun:
    """One run's verdicts and what reconciling it needs."""

    kind: str
    what: str
    tx: TxReport
    figures: Figures
    orders_url: str
    billing_url: str
    logs: dict[str, Path] = field(default_factory=dict)  # group -> its master's data, settled


def broker_args(root: Path) -> tuple[str, ...]:
    """What a group's brokers need to serve the world: its transaction settings (back-checks
    soon after a transaction is left open) and the orders producer group's check secret."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "services-broker.toml"
    cfg.write_text(BROKER_SETTINGS)
    return ("--config", str(cfg), "--tx-secret", f"{PRODUCER_GROUP}={SECRET}")


async def run_services_partition(
    cluster: Cluster,
    nemesis: Nemesis,
    kind: str,
    timing: ServiceTiming,
    root: Path,
    orders_url: str,
    billing_url: str,
) -> ServiceRun:
    """One run of ``kind`` (a name of PARTITIONS) under the world's load; the cluster's
    brokers were started with :func:`broker_args`."""
    if kind not in PARTITIONS:
        raise ValueError(f"unknown partition {kind!r}: {', '.join(PARTITIONS)}")
    spec = WorldSpec(
        root,
        orders_url=orders_url,
        billing_url=billing_url,
        service_url=cluster.url,
        cluster=cluster,
        service_host=nemesis.net.gateway,
        settle_s=timing.settle_s,
        client_timeout_s=REQUEST_TIMEOUT_S,
    )
    figures = Figures(kind)
    async with World(spec) as world:
        progress = world.progress

        def placed() -> int:
            return progress.get("orders.placed")

        async def phase(seconds: float) -> None:
            """The load runs ``seconds`` (the scenario's rhythm); a service that died fails."""
            await world.produce(PLAIN_PER_PHASE)
            await asyncio.sleep(seconds)
            if not (world.orders_running and world.billing and world.billing.running):
                raise AssertionError(f"a service exited during the run; see its log in {root}")

        await world.produce(PLAIN_PER_PHASE)
        if not await progress.wait_for(lambda: placed() > 0 and bool(world.acked), LOAD_START_S):
            raise AssertionError(f"no order placed or send acknowledged in {LOAD_START_S:g} s")
        await phase(timing.before_s)
        hosts = await group_hosts(cluster, nemesis)
        figures.struck()
        what = PARTITIONS[kind](nemesis, hosts)
        try:
            await phase(timing.during_s)
        finally:
            nemesis.heal()
        healed_at, at_heal = time.monotonic(), placed()
        if not await progress.wait_for(lambda: placed() > at_heal, GROUP_WHOLE_S):
            raise AssertionError(f"no order placed within {GROUP_WHOLE_S:g} s of the heal")
        what += f"; placing orders again {time.monotonic() - healed_at:.2f} s after the heal"
        await phase(timing.after_s)
        await world.settle_and_check(figures)
        await cluster.wait_members(GROUP, timeout_s=GROUP_WHOLE_S)
        committed, applied = await world.orders_outcome()
        log = await read_back(cluster, len(committed), ORDERS)
        acknowledged = world.orders.placed if world.orders is not None else set()
        tx = check_transactions(
            committed,
            acknowledged,
            [s.write_id for s in log],
            applied,
            await cluster.open_transactions(),
        )
        logs = await world.logs()
    assert isinstance(logs, dict)
    return ServiceRun(kind, what, tx, figures, orders_url, billing_url, logs)
