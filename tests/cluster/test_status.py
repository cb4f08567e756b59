"""`cluster status` through a group's failovers (real brokers, a real etcd): one master from
the moment a successor is elected, whether the old master was killed (its registration
lingers until its 10 s lease ends: a "former master"), frozen past its lease (it says slave
once it wakes), or stopped cleanly (its keys go at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.cluster.conftest import _require_etcd
from tests.cluster.test_partition import stopped
from txbroker.chaos.cluster import Cluster
from txbroker.cluster import connect_coordinator
from txbroker.cluster.routes import Role
from txbroker.cluster.status import FORMER_MASTER, ClusterStatus, read_status

ENV = {"TXB_INDEX_CAPACITY": "65536"}


async def _status(cluster: Cluster) -> ClusterStatus:
    async with await connect_coordinator(cluster.etcd.url) as coordinator:
        return await read_status(coordinator)


async def _elected(cluster: Cluster, broker_id: str) -> None:
    """Until ``broker_id`` is registered as master (bounded)."""
    await cluster.wait_brokers(
        lambda bs: any(b.broker_id == broker_id and b.role is Role.MASTER for b in bs.values())
    )


def _roles(status: ClusterStatus) -> dict[str, str]:
    return {b.broker: b.role for b in status.brokers}


async def test_status_shows_one_master_through_kill_freeze_and_clean_stop(tmp_path: Path) -> None:
    _require_etcd()
    extra = ("--segment-mib", "8", "--replication", "async")
    async with Cluster(tmp_path / "c", groups=("g1",), per_group=3, extra=extra, env=ENV) as c:
        # Killed: its registration stays for its lease's 10 s; the successor's comes in ~3 s.
        first = await c.kill_master("g1")
        second = await c.wait_master("g1", other_than=first.broker_id)
        status = await _status(c)
        roles = _roles(status)
        assert roles[first.broker_id] == FORMER_MASTER  # still registered, term over
        assert [b for b, r in roles.items() if r == Role.MASTER.value] == [second.broker_id]
        assert status.groups[0].master == status.groups[0].elected == second.broker_id
        former = next(b for b in status.brokers if b.broker == first.broker_id)
        assert former.lag_bytes is not None  # measured against the successor

        # Frozen past its election lease: a successor is elected while the frozen one's
        # registration still says master; woken, it steps down and says slave.
        frozen = c.member(second.broker_id)
        assert frozen.proc.proc is not None
        (third,) = {m.broker_id for m in c.members} - {first.broker_id, second.broker_id}
        with stopped(frozen.proc.proc.pid):
            await _elected(c, third)
            roles = _roles(await _status(c))
            assert roles.get(second.broker_id, FORMER_MASTER) == FORMER_MASTER
            assert [b for b, r in roles.items() if r == Role.MASTER.value] == [third]
        await c.wait_brokers(
            lambda bs: any(
                b.broker_id == second.broker_id and b.role is Role.SLAVE for b in bs.values()
            )
        )
        roles = _roles(await _status(c))
        assert [b for b, r in roles.items() if r == Role.MASTER.value] == [third]

        # Stopped cleanly: its keys go at once; the one left is elected.
        await asyncio.to_thread(c.member(third).proc.stop)
        await _elected(c, second.broker_id)
        roles = _roles(await _status(c))
        assert third not in roles
        assert [b for b, r in roles.items() if r == Role.MASTER.value] == [second.broker_id]
