"""The failover scenarios: the world's services and producer reach two broker groups of three
``--role auto`` brokers each through a NameServer, and every round kill -9s one group's master
under plain sends, @transactional orders and the outbox relay.

Besides the world's checks, no acknowledged plain send may be in a divergent tail a rejoining
broker cut, and the time each new master took to serve is reported. ``master-failover-async``
is the same with ``--replication async``, where the writes a killed master takes with it are
counted as the *loss window* (reported, not a failure). :func:`master_failover` runs a round.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from txbroker.chaos.cluster import Cluster, etcd_missing
from txbroker.chaos.figures import Figures
from txbroker.chaos.scenarios import Sizes, Skip, load_round, out_of_time
from txbroker.chaos.service import GROUP, PLAIN
from txbroker.chaos.world import BROKER_SETTINGS, SECRET, World, WorldSpec
from txbroker.errors import TxbError
from txbroker.server.failover import DIVERGENT_DIR
from txbroker.store import PROP_KEYS
from txbroker.store.record import decode_properties
from txbroker.store.replication import parse_records
from txbroker_sdk import Client

__all__ = [
    "async_cluster",
    "check_tails",
    "distribution",
    "master_failover",
    "summary",
    "sync_cluster",
]

GROUPS: Final = ("g1", "g2")
PER_GROUP: Final = 3  # a master and two slaves: one left to follow the new master
PROBE: Final = "failover-probe"  # the write that proves a new master serves; nobody reads it
PROBE_PAUSE_S: Final = 0.05  # between probes of a master not serving yet


@contextlib.asynccontextmanager
async def _cluster(root: Path, replication: str) -> AsyncIterator[WorldSpec]:
    why = etcd_missing()
    if why is not None:
        raise Skip(why)
    cfg = root / "broker.toml"
    await asyncio.to_thread(_write, cfg, BROKER_SETTINGS)
    extra: tuple[str, ...] = ("--segment-mib", "8", "--config", str(cfg))
    extra += ("--tx-secret", f"{GROUP}={SECRET}", "--replication", replication)
    async with Cluster(
        root / "cluster",
        groups=GROUPS,
        per_group=PER_GROUP,
        extra=extra,
        env={"TXB_INDEX_CAPACITY": "65536"},
    ) as cluster:
        await cluster.create_topic(PROBE, queues=len(GROUPS))
        yield WorldSpec(root, service_url=cluster.url, cluster=cluster)


@contextlib.asynccontextmanager
async def sync_cluster(root: Path, _sizes: Sizes, _f: Figures) -> AsyncIterator[WorldSpec]:
    async with _cluster(root, "sync") as spec:
        yield spec


@contextlib.asynccontextmanager
async def async_cluster(root: Path, _sizes: Sizes, f: Figures) -> AsyncIterator[WorldSpec]:
    f.loss_allowed = True  # the loss window is what this scenario measures
    async with _cluster(root, "async") as spec:
        yield spec


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


async def master_failover(world: World, sizes: Sizes, f: Figures) -> None:
    """A round: let load through (``load_round``), kill the master of the next group, time until a
    slave is elected and until it acknowledges a write (the new master *serves*: with sync
    replication that needs the third broker following it), start the killed one again on the same
    ports and data (it rejoins as a slave, cutting a divergent tail if it has one) and wait until
    the group is whole. After the rounds the world's checks run as for every scenario (every
    acknowledged send, committed order and outbox row applied once; nothing rolled back applied;
    every transaction decided), and then two of this scenario's own:

    - no acknowledged plain send is in a divergent tail a rejoining broker cut (with sync
      replication an acknowledged write is on a slave, and the slave that holds the most wins);
    - the time each new master took to serve, reported as a distribution.

    With ``--replication async`` a write is acknowledged after the master's own flush, so a killed
    master can take acknowledged writes with it: those are the loss window.
    """
    cluster = world.spec.cluster
    assert cluster is not None, "the failover scenarios run in a cluster setting"
    started = time.monotonic()
    for r in range(sizes.rounds):
        if out_of_time(started, sizes, f) or not await load_round(world, sizes, f):
            break
        group = cluster.groups[r % len(cluster.groups)]
        deadline = time.monotonic() + sizes.round_timeout_s
        killed_at = time.monotonic()
        killed = await cluster.kill_master(group)
        f.struck()
        elected = await cluster.wait_master(
            group, other_than=killed.broker_id, timeout_s=sizes.round_timeout_s
        )
        elected_s = time.monotonic() - killed_at
        served_s = await _serves(elected.address, deadline) - killed_at
        f.failover_s.append(round(served_s, 3))
        f.notes.append(
            f"round {r + 1}: {group}'s master {killed.broker_id} killed; {elected.broker_id} "
            f"elected after {elected_s:.2f} s, serving after {served_s:.2f} s"
        )
        await cluster.restart(killed)
        await cluster.wait_members(group, timeout_s=sizes.round_timeout_s)
        f.rounds += 1
    if f.failover_s:
        f.notes.append(f"new master serving after kill -9: {distribution(f.failover_s)}")


async def _serves(address: str, deadline: float) -> float:
    """When ``address`` first acknowledged a write (probes until then, bounded)."""
    async with Client(address, timeout_s=5) as c:
        while True:
            try:
                await c.send(PROBE, b"probe")
                return time.monotonic()
            except TxbError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(PROBE_PAUSE_S)  # the next probe, not a synchronisation


def summary(samples: list[float]) -> dict[str, Any]:
    """The failover times' distribution: median, p90, max, min and the samples (seconds)."""
    if not samples:
        return {"n": 0}
    s = sorted(samples)
    return {
        "n": len(s),
        "median_s": statistics.median(s),
        "p90_s": s[min(len(s) - 1, round(0.9 * (len(s) - 1)))],
        "max_s": s[-1],
        "min_s": s[0],
        "samples_s": samples,
    }


def distribution(samples: list[float]) -> str:
    got = summary(samples)
    if not got["n"]:
        return "no failover measured"
    return (
        f"median {got['median_s']:.2f} s, p90 {got['p90_s']:.2f} s, max {got['max_s']:.2f} s, "
        f"min {got['min_s']:.2f} s over {got['n']} ({', '.join(f'{x:.2f}' for x in samples)})"
    )


def divergent_acknowledged(world: World) -> tuple[int, int]:
    """(acknowledged plain sends found in divergent tails, records in those tails)."""
    cluster = world.spec.cluster
    assert cluster is not None
    found = records = 0
    for m in cluster.members:
        for path in sorted((m.proc.data_dir / DIVERGENT_DIR).glob("*/*.log")):
            offset = int(path.stem)
            for rec in parse_records(path.read_bytes(), offset):
                records += 1
                if rec.topic != PLAIN:
                    continue
                keys = decode_properties(rec.props).get(PROP_KEYS, "")
                found += sum(1 for k in keys.split() if k in world.acked)
    return found, records


async def check_tails(world: World, f: Figures) -> None:
    """After the world's checks: acknowledged sends cut with a divergent tail."""
    found, records = await asyncio.to_thread(divergent_acknowledged, world)
    if records:
        f.notes.append(f"records cut from divergent tails on rejoining: {records}")
    if not found:
        return
    if f.loss_allowed:
        f.notes.append(f"loss window: {found} acknowledged sends were only on a killed master")
    else:
        f.anomalies += found
        f.notes.append(f"{found} acknowledged sends were in a divergent tail")
