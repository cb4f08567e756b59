"""Partitions that cut links, on test hosts (txbroker/chaos/partitions.py): a sync group of three
brokers, etcd and a NameServer each on an address of its own; four writers and a consumer group
in this process, through the NameServer. Each scenario loads the group, cuts links by rule for
8 s (past the lease's 3 s TTL and an election), heals, loads until writes are acknowledged
again, reads everything back and checks the history: no acknowledged write lost, none stored
twice, none out of its key's order, no phantom, nothing a consumer read later gone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster.conftest import TestNet
from txbroker.chaos.nemesis import Nemesis
from txbroker.chaos.partitions import (
    FAILOVER_BOUND_S,
    FLAP,
    Timing,
    partition_cluster,
    run_partition,
)

# One worker runs them one after another: each takes both cores' worth of brokers for ~25 s.
pytestmark = pytest.mark.xdist_group("partitions")

# Partitions that cost the master its lease, so another broker takes the group over.
FAILED_OVER = {"isolate-master", "master-etcd"}
# Partitions that leave a sync master its lease but no slave: nothing may be acknowledged
# from the cut until the heal (a resend finding its record in the master's log included).
NO_SLAVE = {"master-slaves", "master-slaves-one-way"}
# A link down 2 s at a time may never outlast the lease (3 s TTL): the group may not notice.
MAYBE_UNNOTICED = {FLAP}

KINDS = [
    "isolate-master",
    "master-slaves",
    "master-etcd",
    "client-master",
    "halves",
    "master-slaves-one-way",
    FLAP,
]


@pytest.mark.parametrize("kind", KINDS)
async def test_no_acknowledged_write_is_lost_across_a_partition(
    net: TestNet, tmp_path: Path, kind: str
) -> None:
    timing = Timing()
    async with partition_cluster(tmp_path / "c", net, "sync") as cluster:
        report, what = await run_partition(cluster, Nemesis(net), kind, timing)
    print(f"\n{kind}: {what}\n{report.summary()}")
    assert report.acknowledged > 0
    assert report.lost == []
    assert report.duplicated == []
    assert report.out_of_order == []
    assert report.phantoms == []
    assert report.vanished == []
    # Every partition here stops the group acknowledging for a while: measured, not hidden.
    assert report.unavailable_s or kind in MAYBE_UNNOTICED
    if kind in FAILED_OVER:
        # Writers leave the old master by their request timeout and find the new one: the
        # group is unavailable for an election and a timeout, not for the whole cut.
        assert max(report.unavailable_s) <= FAILOVER_BOUND_S, report.unavailable_s
    if kind in NO_SLAVE:
        assert max(report.unavailable_s) >= timing.during_s, report.unavailable_s
