"""Partition scenarios on test hosts: a group of three ``--role auto`` brokers, etcd and a
NameServer, each on a host of its own (:mod:`txbroker.chaos.netns`); writers and a consumer
group in this process go through the NameServer. One run: load for a while, one partition of
:data:`~txbroker.chaos.nemesis.PARTITIONS` for a while (or a link flapping), heal, load again
until the group acknowledges writes, then read everything back and check the history
(:mod:`txbroker.chaos.history`).

    async with partition_cluster(root, net, "sync") as cluster:
        report = await run_partition(cluster, Nemesis(net), "master-etcd", Timing())
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker.chaos.cluster import Cluster
from txbroker.chaos.history import Delivery, History, Outcome, Report, Stored, check
from txbroker.chaos.nemesis import PARTITIONS, PROXIED, GroupHosts, Nemesis
from txbroker.chaos.netns import TestNet
from txbroker.cluster.election import DEFAULT_TTL_S
from txbroker.errors import TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import GroupsRequest
from txbroker_sdk import Client
from txbroker_sdk.consumer import Consumer

__all__ = [
    "FAILOVER_BOUND_S",
    "FLAP",
    "GROUP",
    "GROUP_WHOLE_S",
    "REQUEST_TIMEOUT_S",
    "TOPIC",
    "Timing",
    "group_hosts",
    "partition_cluster",
    "read_back",
    "run_partition",
]

GROUP: Final = "g1"
TOPIC: Final = "history"
QUEUES: Final = 4
FLAP: Final = "flap-master-etcd"  # the master's link to etcd cut and healed every 2 s
CHECKER_GROUP: Final = "history-check"
# A writer's request: past a healthy sync write by far, short enough that a writer cut from
# the master notices within the partition and tries the NameServer's current master again.
REQUEST_TIMEOUT_S: Final = 2.0
# The longest the group may go without acknowledging a write when its master is cut off from
# everything: a new master within the election's target (the lease's TTL plus 2 s to take over,
# txbroker/cluster/election.py), plus one request timeout (a writer's attempt sent to the silent
# old master just before the NameServer named the new one fails only then), plus 1 s for the
# retry pause, the route fetch and the new master's first sync write.
FAILOVER_BOUND_S: Final = DEFAULT_TTL_S + 2.0 + REQUEST_TIMEOUT_S + 1.0
RETRY_PAUSE_S: Final = 0.05  # after a failed attempt: no hot loop against a group that is down
READ_BOUND_S: Final = 60.0  # reading everything back after the heal, bounded
GROUP_WHOLE_S: Final = 60.0  # every broker registered again, one master, after the heal


@dataclass(frozen=True, slots=True)
class Timing:
    """How long each phase lasts: CI size by default. ``during_s`` outlasts the election
    lease's 3 s TTL plus an election, so a master cut from etcd is replaced within it."""

    writers: int = 4
    before_s: float = 1.0
    during_s: float = 8.0
    after_s: float = 2.0  # load after the first acknowledgement since the heal


@contextlib.asynccontextmanager
async def partition_cluster(
    root: Path,
    net: TestNet,
    replication: str,
    *,
    kind: str = "",
    extra: tuple[str, ...] = (),
) -> AsyncIterator[Cluster]:
    """g1: three --role auto brokers with ``replication`` (and ``extra``), etcd and a
    NameServer on ``net``; TOPIC created. For a ``kind`` of PROXIED the brokers' links to one
    another go through proxies (:class:`~txbroker.chaos.cluster.Cluster`'s ``proxied``)."""
    async with Cluster(
        root,
        groups=(GROUP,),
        per_group=3,
        extra=("--replication", replication, "--segment-mib", "8", *extra),
        env={"TXB_INDEX_CAPACITY": "65536"},
        net=net,
        proxied=kind in PROXIED,
    ) as cluster:
        await cluster.create_topic(TOPIC, QUEUES)
        yield cluster


async def group_hosts(cluster: Cluster, nemesis: Nemesis) -> GroupHosts:
    master_id = (await cluster.masters())[GROUP].broker_id
    hosts = {m.broker_id: m.host for m in cluster.members if m.host is not None}
    assert cluster.etcd_host is not None, "partitions need a cluster on a TestNet"
    return GroupHosts(
        master=hosts[master_id],
        slaves=tuple(h for b, h in sorted(hosts.items()) if b != master_id),
        etcd=cluster.etcd_host,
        client=nemesis.client,
        master_link=cluster.proxies.get(master_id),
    )


async def run_partition(
    cluster: Cluster, nemesis: Nemesis, kind: str, timing: Timing
) -> tuple[Report, str]:
    """One run of ``kind`` (a name of PARTITIONS, or FLAP); returns the checker's report and
    what was cut."""
    if kind != FLAP and kind not in PARTITIONS:
        raise ValueError(f"unknown partition {kind!r}: {', '.join([*PARTITIONS, FLAP])}")
    history = History()
    order: dict[str, list[str]] = {f"k{p}": [] for p in range(timing.writers)}
    deliveries: list[Delivery] = []
    acked_since: list[float] = []  # when the first write after the heal was acknowledged
    healed = asyncio.Event()
    stop = asyncio.Event()

    async def writer(p: int) -> None:
        key = f"k{p}"
        async with await Client.connect(cluster.url, timeout_s=REQUEST_TIMEOUT_S) as c:
            seq = 0
            while not stop.is_set():
                write_id = f"w{p}-{seq}"
                order[key].append(write_id)
                # The same write again until acknowledged (its idempotency key dedupes), or
                # until the run ends with its outcome unknown.
                while not stop.is_set():
                    async with history.op(p, write_id) as op:
                        await c.send(TOPIC, write_id.encode(), key=key, idempotency_key=write_id)
                    if op.outcome is Outcome.OK:
                        if healed.is_set() and not acked_since:
                            acked_since.append(time.monotonic())
                        break
                    await asyncio.sleep(RETRY_PAUSE_S)  # the next attempt, not a sync
                seq += 1

    async def consume() -> None:
        async with (
            await Client.connect(cluster.url, timeout_s=REQUEST_TIMEOUT_S) as c,
            Consumer(c, "live", TOPIC, hold_ms=200) as cons,
        ):
            while not stop.is_set():
                try:
                    batch = await cons.fetch(200)
                except (TxbError, TimeoutError):
                    await asyncio.sleep(RETRY_PAUSE_S)  # the group is between masters
                    continue
                for m in batch:
                    deliveries.append(Delivery(m.msg.body.decode(), m.reconsume_count))
                    m.ack()

    tasks = [asyncio.create_task(writer(p)) for p in range(timing.writers)]
    tasks.append(asyncio.create_task(consume()))
    try:
        await _running(tasks, timing.before_s)
        hosts = await group_hosts(cluster, nemesis)
        history.cut_s = history.now()
        if kind == FLAP:
            what = f"{hosts.master.name}'s link to etcd flapping"
            async with nemesis.flapping(hosts.master, hosts.etcd):
                await _running(tasks, timing.during_s)
        else:
            what = PARTITIONS[kind](nemesis, hosts)
            try:
                await _running(tasks, timing.during_s)
            finally:
                nemesis.heal()
        history.heal_s = history.now()
        healed.set()
        healed_at = time.monotonic()
        async with asyncio.timeout(GROUP_WHOLE_S):
            while not acked_since:
                await _running(tasks, 0.1)
        await _running(tasks, timing.after_s)
        stop.set()
        async with asyncio.timeout(REQUEST_TIMEOUT_S * 4):
            await asyncio.gather(*tasks)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if hosts.master_link is not None:
        link = hosts.master_link
        what += f"; {link.stalls} of {link.degraded} chunks through it stalled as lost"
    what += f"; acknowledging again {acked_since[0] - healed_at:.2f} s after the heal"
    await cluster.wait_members(GROUP, timeout_s=GROUP_WHOLE_S)
    acked = sum(1 for o in history.ops if o.outcome is Outcome.OK)
    log = await read_back(cluster, acked)
    return check(history, log, deliveries, order), what


async def _running(tasks: list[asyncio.Task[None]], seconds: float) -> None:
    """Let the load run ``seconds``; a task that ended early raises here."""
    done, _ = await asyncio.wait(tasks, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for t in done:
        t.result()
        raise AssertionError("a writer or the consumer ended before the run did")


async def read_back(cluster: Cluster, at_least: int, topic: str = TOPIC) -> list[Stored]:
    """Every message of ``topic`` at the group's master, by a consumer group of its own from
    the start: until a fetch finds no more and either ``at_least`` came or every queue was read
    to its end at the master (bounded; what is missing then is the checker's to report)."""
    got: list[Stored] = []
    group = f"{CHECKER_GROUP}-{uuid.uuid4().hex[:8]}"
    async with (
        await Client.connect(cluster.url, timeout_s=5) as c,
        Consumer(c, group, topic, hold_ms=300) as cons,
    ):
        try:
            async with asyncio.timeout(READ_BOUND_S):
                while True:
                    batch = await cons.fetch(300)
                    for m in batch:
                        msg = m.msg
                        stored = Stored(
                            msg.body.decode(), msg.key or "", msg.queue_id, msg.queue_offset
                        )
                        got.append(stored)
                        m.ack()
                    if not batch and (len(got) >= at_least or await _at_end(cons, cluster, topic)):
                        return got  # the checker tells any acknowledged write not read
        except TimeoutError:
            ends: dict[int, int] = {}
            for s in got:
                ends[s.queue_id] = max(ends.get(s.queue_id, -1), s.queue_offset)
            raise AssertionError(
                f"read back {len(got)} messages of at least {at_least} acknowledged within "
                f"{READ_BOUND_S:g} s; the last offset read per queue: {ends}; "
                f"{await _where(cluster, group, topic)}"
            ) from None


async def _at_end(cons: Consumer, cluster: Cluster, topic: str) -> bool:
    """Whether ``cons``'s group has read every queue of ``topic`` to its end at the master."""
    await cons.commit()
    async with Client(
        (await cluster.masters())[GROUP].address, timeout_s=5, connect_deadline_s=0
    ) as c:
        res = await c.request(Opcode.OFFSETS, GroupsRequest(cons.group, topic))
    queues = [q for g in res.groups for q in g.queues]
    return bool(queues) and all(q.committed >= q.max_offset for q in queues)


async def _where(cluster: Cluster, group: str, topic: str) -> str:
    """Each broker's role, its queues' ends and ``group``'s view there: what a failed read
    back needs to be told apart (a message missing, or a queue not assigned or not readable)."""
    seen = []
    masters = await cluster.masters()
    for m in cluster.members:
        try:
            async with Client(m.proc.url, timeout_s=2, connect_deadline_s=0) as c:
                res = await c.request(Opcode.OFFSETS, GroupsRequest(group, topic))
                info = str(
                    [
                        (g.members, [(q.queue, q.max_offset, q.committed) for q in g.queues])
                        for g in res.groups
                    ]
                )
        except TxbError as e:
            info = f"unreachable: {e}"
        role = "master" if masters[GROUP].broker_id == m.broker_id else "slave"
        seen.append(f"{m.broker_id} ({role}): {info}")
    return "; ".join(seen)
