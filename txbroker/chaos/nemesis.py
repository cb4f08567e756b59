"""The nemesis: cuts and heals links between the hosts of a :class:`~txbroker.chaos.netns.TestNet`
by rule, one-way or both ways, with iptables DROP rules inside a host's namespace: packets vanish
(no RST, no ICMP), so both ends wait out their own deadlines, as across a real partition.
Connections already open are cut as well as new ones.

    nemesis = Nemesis(net)
    nemesis.cut(master, etcd)  # both ways
    nemesis.cut(net_client, master, one_way=True)  # the client's packets to the master vanish
    nemesis.heal()

This process (the test's clients) is :attr:`Nemesis.client`, a host without a namespace of its
own: rules about it go into the other end's namespace, never the machine's.

Latency and loss need a link through a :class:`~txbroker.chaos.proxy.FaultProxy` (the kernel
has no netem): :meth:`Nemesis.degrade` sets a proxy's, and :meth:`Nemesis.heal` sets it back.

:data:`PARTITIONS` names the partitions the scenarios apply to a broker group
(:class:`GroupHosts`): each returns what it cut, for the report.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Final

from txbroker.chaos.netns import Host, TestNet
from txbroker.chaos.proxy import LOSS_STALL_S, FaultProxy

__all__ = ["LINK_LATENCY_S", "LINK_LOSS", "PARTITIONS", "PROXIED", "GroupHosts", "Nemesis"]

# How often a flapping link changes state: long enough for a TCP handshake and a request to get
# through while it is up, short enough that a 3 s lease sees it down and up within one TTL.
FLAP_PERIOD_S: Final = 2.0
# A degraded replication link: a WAN's latency each way, and 1% of its segments lost (each a
# stall of a retransmission timeout, txbroker/chaos/proxy.py).
LINK_LATENCY_S: Final = 0.05
LINK_LOSS: Final = 0.01


class Nemesis:
    """Cuts between a net's hosts, and :meth:`heal`, which removes every one of them."""

    def __init__(self, net: TestNet) -> None:
        self.net = net
        self.client = Host("client", "", net.gateway)
        self.cuts: list[tuple[str, str]] = []  # (from, to) of every one-way cut in force
        self._touched: set[Host] = set()
        self._degraded: set[FaultProxy] = set()

    def cut(self, a: Host, b: Host, *, one_way: bool = False) -> None:
        """Packets from ``a`` to ``b`` vanish, and (unless ``one_way``) from ``b`` to ``a``."""
        if a == b:
            raise ValueError(f"a host cannot be cut from itself: {a.name}")
        self._drop(a, b)
        if not one_way:
            self._drop(b, a)

    def isolate(self, a: Host) -> None:
        """``a`` cut both ways from every other host and from the client."""
        for b in (*self.net.hosts.values(), self.client):
            if b != a:
                self.cut(a, b)

    def split(self, side_a: Iterable[Host], side_b: Iterable[Host]) -> None:
        """Every host of one side cut both ways from every host of the other."""
        others = list(side_b)
        for a in side_a:
            for b in others:
                self.cut(a, b)

    def degrade(self, link: FaultProxy, latency_s: float, loss: float) -> None:
        """Every chunk through ``link`` (both ways) delayed ``latency_s``, and segments lost
        with probability ``loss``, until :meth:`heal`."""
        link.latency_s, link.loss = latency_s, loss
        self._degraded.add(link)

    def heal(self) -> None:
        """Every cut removed (the filter rules of each host touched are flushed), every
        degraded link whole again."""
        for host in self._touched:
            host.iptables("-F", "INPUT")
            host.iptables("-F", "OUTPUT")
        self._touched.clear()
        self.cuts.clear()
        for link in self._degraded:
            link.latency_s, link.loss = 0.0, 0.0
        self._degraded.clear()

    @contextlib.asynccontextmanager
    async def flapping(
        self, a: Host, b: Host, period_s: float = FLAP_PERIOD_S
    ) -> AsyncIterator[None]:
        """For the block: the link a-b cut for ``period_s``, up for ``period_s``, again and again;
        healed at the end."""

        async def flap() -> None:
            while True:
                self.cut(a, b)
                await asyncio.sleep(period_s)  # the fault's own rhythm, not a synchronisation
                self.heal()
                await asyncio.sleep(period_s)

        task = asyncio.create_task(flap())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.heal()

    def _drop(self, src: Host, dst: Host) -> None:
        # At the sender when it has a namespace (its packets never leave), else at the receiver.
        if src.netns:
            src.iptables("-A", "OUTPUT", "-d", dst.address, "-j", "DROP")
            self._touched.add(src)
        elif dst.netns:
            dst.iptables("-A", "INPUT", "-s", src.address, "-j", "DROP")
            self._touched.add(dst)
        else:
            raise ValueError("a cut needs a host with a namespace at one end")
        self.cuts.append((src.name, dst.name))


@dataclass(frozen=True, slots=True)
class GroupHosts:
    """A broker group's hosts at the moment a partition is applied."""

    master: Host
    slaves: tuple[Host, ...]
    etcd: Host
    client: Host
    # The proxy the slaves reach the master through, in a cluster whose replication links
    # are proxied (txbroker/chaos/cluster.py); None in others.
    master_link: FaultProxy | None = None


def _isolate_master(n: Nemesis, g: GroupHosts) -> str:
    n.isolate(g.master)
    return f"{g.master.name} isolated from every host and the clients"


def _master_from_etcd(n: Nemesis, g: GroupHosts) -> str:
    n.cut(g.master, g.etcd)
    return f"{g.master.name} cut from etcd only"


def _master_from_slaves(n: Nemesis, g: GroupHosts) -> str:
    for s in g.slaves:
        n.cut(g.master, s)
    return f"{g.master.name} cut from its slaves {', '.join(s.name for s in g.slaves)} only"


def _client_from_master(n: Nemesis, g: GroupHosts) -> str:
    n.cut(g.client, g.master)
    return f"the clients cut from {g.master.name} only"


def _halves(n: Nemesis, g: GroupHosts) -> str:
    # The master and one slave on one side; the other slave with etcd on the other.
    first, second = (g.master, *g.slaves[:1]), (*g.slaves[1:], g.etcd)
    n.split(first, second)
    names = [", ".join(h.name for h in side) for side in (first, second)]
    return f"the group split: [{names[0]}] | [{names[1]}]"


def _master_to_slaves_one_way(n: Nemesis, g: GroupHosts) -> str:
    for s in g.slaves:
        n.cut(g.master, s, one_way=True)
    return f"{g.master.name}'s packets to its slaves vanish (one way)"


def _replication_latency_loss(n: Nemesis, g: GroupHosts) -> str:
    if g.master_link is None:
        raise ValueError("replication-latency-loss needs a cluster with proxied links")
    n.degrade(g.master_link, LINK_LATENCY_S, LINK_LOSS)
    return (
        f"the slaves' replication link to {g.master.name} through the proxy: "
        f"{LINK_LATENCY_S * 1000:.0f} ms each way, {LINK_LOSS:.0%} of segments lost (each a "
        f"{LOSS_STALL_S * 1000:.0f} ms stall)"
    )


PARTITIONS: Final[dict[str, Callable[[Nemesis, GroupHosts], str]]] = {
    "isolate-master": _isolate_master,
    "master-etcd": _master_from_etcd,
    "master-slaves": _master_from_slaves,
    "client-master": _client_from_master,
    "halves": _halves,
    "master-slaves-one-way": _master_to_slaves_one_way,
    "replication-latency-loss": _replication_latency_loss,
}
# The kinds whose cluster needs its replication links proxied.
PROXIED: Final = frozenset({"replication-latency-loss"})
