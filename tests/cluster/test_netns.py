"""Test hosts in network namespaces (txbroker/chaos/netns.py): a cluster whose etcd, brokers and
NameServer each run on an address of their own, reached by this process over the bridge; and
nothing of a net left behind, after a failing test or a dead worker."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.conftest import _require_netns
from txbroker.chaos import netns
from txbroker.chaos.cluster import Cluster
from txbroker.chaos.netns import TestNet
from txbroker_sdk import Client


def _leftovers(prefix: str) -> list[str]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [w for w in (links + spaces).split() if w.startswith(prefix)]


def _netns_inode(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/net").st_ino


async def test_every_process_runs_on_a_host_of_its_own_and_advertises_its_address(
    net: TestNet, tmp_path: Path
) -> None:
    async with Cluster(
        tmp_path / "c",
        groups=("g1",),
        per_group=3,
        extra=("--replication", "sync", "--segment-mib", "8"),
        env={"TXB_INDEX_CAPACITY": "65536"},
        net=net,
    ) as cluster:
        await cluster.create_topic("orders", 2)
        registered = await cluster.wait_brokers(lambda bs: len(bs) == 3)
        by_id = {b.broker_id: b for b in registered.values()}
        for m in cluster.members:
            assert m.host is not None and m.proc.proc is not None
            assert by_id[m.broker_id].address == f"txb://{m.host.address}:9876"
            # The process itself is in the host's namespace, not this one's.
            ns_file = Path("/run/netns") / m.host.netns
            assert _netns_inode(m.proc.proc.pid) == ns_file.stat().st_ino
            assert _netns_inode(m.proc.proc.pid) != _netns_inode(os.getpid())
        assert cluster.etcd.url == f"etcd://{net.hosts['etcd'].address}:2379"
        assert cluster.nameserver_host is not None
        assert cluster.url == f"txbns://{cluster.nameserver_host.address}:9878"
        master = (await cluster.masters())["g1"]
        # A client on the bridge's address, routed by the NameServer to the master's address.
        async with await Client.connect(cluster.url, timeout_s=10) as c:
            receipt = await c.send("orders", b"x", key="k")
        assert receipt.topic == "orders"
        host = master.address.removeprefix("txb://").rsplit(":", 1)[0]
        assert net.subnet is not None and ipaddress.ip_address(host) in net.subnet
    assert all(not m.running for m in cluster.members)


def test_a_net_removes_everything_it_made_when_the_block_fails() -> None:
    _require_netns()
    made = TestNet()
    with pytest.raises(RuntimeError, match="the test failed"), made:
        host = made.host("a")
        sleeper = subprocess.Popen(
            [*host.run_prefix, sys.executable, "-c", "input()"], stdin=subprocess.PIPE
        )
        assert _leftovers(made.prefix)
        raise RuntimeError("the test failed")
    # The process left running in the host is killed with the net.
    assert sleeper.wait(timeout=10) == -9
    assert _leftovers(made.prefix) == []


def test_a_new_net_removes_what_a_dead_process_left() -> None:
    _require_netns()
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    prefix = f"tn{gone.pid:06x}0"
    subprocess.run(["ip", "netns", "add", f"{prefix}-etcd"], check=True)
    subprocess.run(["ip", "link", "add", f"{prefix}b", "type", "bridge"], check=True)
    try:
        with TestNet() as fresh:
            assert fresh.prefix != prefix
            assert _leftovers(prefix) == []
    finally:
        netns.run("ip", "netns", "del", f"{prefix}-etcd", check=False)
        netns.run("ip", "link", "del", f"{prefix}b", check=False)
