"""A cluster on loopback for the failover campaign and its tests: a real etcd, broker groups of
``--role auto`` brokers and a NameServer, each a child process on fixed ports of its own, so a
broker killed and started again comes back at the same address, as a restarted machine would.

    async with Cluster(root, groups=("g1", "g2"), per_group=3) as cluster:
        killed = await cluster.kill_master("g1")
        elected = await cluster.wait_master("g1", other_than=killed.broker_id)
        await cluster.restart(killed)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker.chaos.netns import Host, TestNet
from txbroker.chaos.proxy import FaultProxy
from txbroker.cluster import connect_coordinator
from txbroker.cluster.coordination import EventKind
from txbroker.cluster.routes import (
    BROKERS_PREFIX,
    ROOT,
    BrokerInfo,
    Role,
    choose_masters,
    election_group,
)
from txbroker.errors import NoRoute
from txbroker.nameserver import READY_PREFIX
from txbroker.runtime.brokerproc import BrokerProcess, terminate
from txbroker.runtime.etcdproc import ETCD_BIN, EtcdServer, free_port
from txbroker_sdk import Client

__all__ = [
    "Cluster",
    "Member",
    "NameServerProcess",
    "Registrations",
    "wait_for_brokers",
    "etcd_missing",
    "wait_for_registrations",
]

START_TIMEOUT_S: Final = 30.0
# On a test host of its own a process has every port to itself: the defaults of each.
ETCD_PORTS: Final = (2379, 2380)  # client, peer
BROKER_PORTS: Final = (9876, 9877)  # TCP, HTTP
NAMESERVER_PORT: Final = 9878


def etcd_missing() -> str | None:
    """Why a cluster cannot start here (no etcd binary, no etcd client), or None."""
    if not ETCD_BIN.exists():
        return f"no etcd at {ETCD_BIN} (apt-get install etcd-server)"
    try:
        import aetcd  # noqa: F401
    except ImportError:
        return "no etcd client (pip install 'txbroker[cluster]')"
    return None


class NameServerProcess:
    """`txbroker nameserver --coordinator URL --host HOST --port PORT *extra`, started with
    ``run_prefix`` before it; ``address`` is its host:port."""

    def __init__(
        self,
        coordinator: str,
        log_path: Path,
        port: int = 0,
        host: str = "127.0.0.1",
        run_prefix: tuple[str, ...] = (),
        extra: tuple[str, ...] = (),
    ) -> None:
        self.coordinator = coordinator
        self.extra = extra
        self.log_path = log_path
        self.port = port
        self.host = host
        self.run_prefix = run_prefix
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""

    def start(self) -> NameServerProcess:
        cmd = [*self.run_prefix, sys.executable, "-m", "txbroker.cli", "nameserver"]
        cmd += ["--coordinator", self.coordinator, "--host", self.host, "--port", str(self.port)]
        cmd += self.extra
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=dict(os.environ)
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"nameserver did not start: {line!r}; see {self.log_path}")
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        self.address = fields["tcp"]
        return self

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM and wait (bounded); SIGKILL if it hangs."""
        if self.proc is None:
            return None
        terminate(self.proc, timeout_s)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


@dataclass
class Member:
    """One broker of the cluster: its group, id and process (same ports at every start), and
    its test host in a cluster on a :class:`~txbroker.chaos.netns.TestNet`."""

    group: str
    broker_id: str
    proc: BrokerProcess
    host: Host | None = None

    @property
    def running(self) -> bool:
        p = self.proc.proc
        return p is not None and p.poll() is None


class Cluster:
    """etcd, ``groups`` of ``per_group`` brokers each, one NameServer; ``extra`` is given to
    every broker (replication mode, transaction settings...).

    On loopback by default; given ``net``, each of them runs on a host of its own
    (``etcd``, ``nameserver`` and each broker id), listening on and advertising that host's
    address, on the well-known ports (each host has every port to itself).

    Given ``net`` and ``proxied``, a broker's connections to another broker (replication: a
    slave follows its master) go through a :class:`~txbroker.chaos.proxy.FaultProxy` in this
    process, one per broker (``proxies``, by broker id), whose latency and loss are then the
    link's: a DNAT rule in each broker's host sends what it opens to another broker's port to
    that broker's proxy, which forwards it there. Clients, etcd and the NameServer reach the
    brokers directly."""

    def __init__(
        self,
        root: Path,
        *,
        groups: tuple[str, ...] = ("g1", "g2"),
        per_group: int = 3,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        net: TestNet | None = None,
        proxied: bool = False,
    ) -> None:
        if proxied and net is None:
            raise ValueError("proxied replication links need a cluster on a TestNet")
        self.root = root
        self.groups = groups
        self.per_group = per_group
        self.net = net
        root.mkdir(parents=True, exist_ok=True)
        self.etcd_host = net.host("etcd") if net is not None else None
        if self.etcd_host is None:
            self.etcd = EtcdServer(root / "etcd")
        else:
            self.etcd = EtcdServer(root / "etcd", self.etcd_host.address, self.etcd_host.run_prefix)
            self.etcd.client_port, self.etcd.peer_port = ETCD_PORTS
        self.members: list[Member] = []
        self._extra = extra
        self._env = env or {}
        self.nameserver: NameServerProcess | None = None
        self.nameserver_host: Host | None = None
        # Every master seen registered: (group, epoch) -> broker id (who stored what).
        self.terms: dict[tuple[str, int], str] = {}
        self._proxied = proxied
        self.proxies: dict[str, FaultProxy] = {}  # broker id -> the proxy its peers reach it by
        self._proxying = contextlib.AsyncExitStack()

    @property
    def url(self) -> str:
        """The NameServer's address for clients (``await Client.connect("txbns://...")``)."""
        assert self.nameserver is not None
        return f"txbns://{self.nameserver.address}"

    async def __aenter__(self) -> Cluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        await asyncio.to_thread(self.etcd.start)
        ids = [(g, f"{g}-{chr(ord('a') + i)}") for g in self.groups for i in range(self.per_group)]
        hosts = {b: self.net.host(b) for _, b in ids} if self.net is not None else {}
        if self._proxied:
            await self._proxy_links(hosts)
        for group, broker_id in ids:
            host = hosts.get(broker_id)
            if host is None:
                where: tuple[str, ...] = ("--host", "127.0.0.1")
                where += ("--port", str(free_port()), "--http-port", str(free_port()))
            else:
                where = ("--host", host.address, "--port", str(BROKER_PORTS[0]))
                where += ("--http-port", str(BROKER_PORTS[1]))
            proc = BrokerProcess(
                self.root / broker_id,
                *where,
                *("--group", group, "--role", "auto"),
                *("--coordinator", self.etcd.url, "--broker-id", broker_id),
                *self._extra,
                env=self._env,
                run_prefix=host.run_prefix if host is not None else (),
            )
            self.members.append(Member(group, broker_id, proc, host))
            await asyncio.to_thread(proc.start)
        log = self.root / "nameserver.log"
        if self.net is None:
            ns = NameServerProcess(self.etcd.url, log, free_port())
        else:
            self.nameserver_host = host = self.net.host("nameserver")
            ns = NameServerProcess(
                self.etcd.url, log, NAMESERVER_PORT, host.address, host.run_prefix
            )
        self.nameserver = await asyncio.to_thread(ns.start)
        await self._wait(lambda now: set(self.groups) <= set(now.masters()))

    async def _proxy_links(self, hosts: dict[str, Host]) -> None:
        """Before any broker starts (a connection opened before its DNAT rule would go
        around the proxy): a proxy in front of each broker, and each other broker's host sending
        what it opens to that broker's port to the proxy."""
        assert self.net is not None
        for broker_id, target in hosts.items():
            proxy = FaultProxy(
                BROKER_PORTS[0], target_host=target.address, listen_host=self.net.gateway
            )
            self.proxies[broker_id] = await self._proxying.enter_async_context(proxy)
            to = f"{self.net.gateway}:{proxy.port}"
            for other in hosts.values():
                if other != target:
                    other.iptables(
                        *("-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", target.address),
                        *("--dport", str(BROKER_PORTS[0]), "-j", "DNAT", "--to-destination", to),
                    )

    async def stop(self) -> None:
        if self.nameserver is not None:
            await asyncio.to_thread(self.nameserver.stop)
        # Slaves first: a master stopped before its slaves would hand over to one of them,
        # which would take over for the moment it has left.
        masters: set[str] = set()
        with contextlib.suppress(Exception):  # etcd may be what failed: stop them anyway
            async with asyncio.timeout(10):
                masters = {b.broker_id for b in (await self.masters()).values()}
        for m in sorted(self.members, key=lambda m: m.broker_id in masters):
            if m.proc.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    m.proc.proc.send_signal(signal.SIGCONT)  # a stopped one cannot stop
            await asyncio.to_thread(m.proc.stop)
        await asyncio.to_thread(self.etcd.kill)
        await self._proxying.aclose()
        self.proxies.clear()

    def member(self, broker_id: str) -> Member:
        return next(m for m in self.members if m.broker_id == broker_id)

    async def create_topic(self, topic: str, queues: int) -> None:
        """``txbroker topic create`` spread over every group (routes in etcd)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "txbroker.cli", "topic", "create", topic, "--queues", str(queues)),
            *("--groups", ",".join(self.groups), "--coordinator", self.etcd.url),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"topic create {topic} failed: {out.decode(errors='replace')}")

    async def open_transactions(self) -> int:
        """Transactions open at every group's master (a group without one raises)."""
        masters = await self.masters()
        missing = [g for g in self.groups if g not in masters]
        if missing:
            raise NoRoute(f"groups {missing} have no master now")
        total = 0
        for info in masters.values():
            async with Client(info.address, timeout_s=5) as admin:
                total += (await admin.list_transactions(limit=1)).total
        return total

    # What etcd says.

    async def wait_brokers(
        self, check: Callable[[dict[str, BrokerInfo]], bool], timeout_s: float = 30.0
    ) -> dict[str, BrokerInfo]:
        """The registered brokers (by key) once ``check`` holds of them (bounded)."""
        return (await self._wait(lambda now: check(now.brokers), timeout_s)).brokers

    async def _wait(
        self, check: Callable[[Registrations], bool], timeout_s: float = 30.0
    ) -> Registrations:
        def seen(now: Registrations) -> bool:
            for b in now.brokers.values():
                if b.role is Role.MASTER and b.epoch:
                    self.terms.setdefault((b.group, b.epoch), b.broker_id)
            return check(now)

        return await wait_for_registrations(self.etcd.url, seen, timeout_s)

    async def masters(self) -> dict[str, BrokerInfo]:
        return (await self._wait(lambda _: True)).masters()

    async def kill_master(self, group: str) -> Member:
        """kill -9 the master of ``group`` now; returns it."""
        info = (await self.masters())[group]
        m = self.member(info.broker_id)
        await asyncio.to_thread(m.proc.kill)
        return m

    async def wait_master(
        self, group: str, *, other_than: str, timeout_s: float = 30.0
    ) -> BrokerInfo:
        """The first master of ``group`` other than ``other_than`` (a former master's
        lingering registration is none)."""

        def elected(now: Registrations) -> bool:
            master = now.masters().get(group)
            return master is not None and master.broker_id != other_than

        return (await self._wait(elected, timeout_s)).masters()[group]

    async def restart(self, m: Member) -> None:
        await asyncio.to_thread(m.proc.start)

    async def wait_members(self, group: str, timeout_s: float = 30.0) -> None:
        """Until every broker of ``group`` is registered and exactly one as master."""
        n = sum(1 for m in self.members if m.group == group)

        def ready(now: Registrations) -> bool:
            mine = [b for b in now.brokers.values() if b.group == group]
            return (
                len(mine) == n
                and sum(b.role is Role.MASTER for b in mine) == 1
                and group in now.masters()
            )

        await self._wait(ready, timeout_s)


@dataclass
class Registrations:
    """The brokers registered (by key) and each group's election (group -> the key's create
    revision, the current term's epoch), as etcd has them."""

    brokers: dict[str, BrokerInfo]
    elections: dict[str, int]

    def masters(self) -> dict[str, BrokerInfo]:
        """Each group's master as the NameServer names it (``routes.choose_masters``)."""
        return dict(choose_masters(self.brokers.values(), self.elections))

    def put(self, key: str, value: bytes, create_revision: int) -> None:
        if key.startswith(BROKERS_PREFIX):
            self.brokers[key] = BrokerInfo.from_json(value)
        elif (group := election_group(key)) is not None:
            self.elections[group] = create_revision

    def delete(self, key: str) -> None:
        self.brokers.pop(key, None)
        if (group := election_group(key)) is not None:
            self.elections.pop(group, None)


async def wait_for_registrations(
    coordinator_url: str, check: Callable[[Registrations], bool], timeout_s: float = 30.0
) -> Registrations:
    """The registrations once ``check`` holds of them: /txb/ listed, then followed by a watch
    from the listing's revision, within ``timeout_s``."""
    now = Registrations({}, {})
    async with await connect_coordinator(coordinator_url) as coordinator:
        listing = await coordinator.list_prefix(ROOT)
        for kv in listing.items:
            now.put(kv.key, kv.value, kv.create_revision)
        if check(now):
            return now
        async with asyncio.timeout(timeout_s):
            async with coordinator.watch_prefix(
                ROOT, start_revision=listing.revision + 1
            ) as events:
                async for event in events:
                    if event.kind is EventKind.DELETE:
                        now.delete(event.key)
                    else:
                        now.put(event.key, event.value, event.create_revision)
                    if check(now):
                        return now
    raise AssertionError("the watch ended")


async def wait_for_brokers(
    coordinator_url: str,
    check: Callable[[dict[str, BrokerInfo]], bool],
    timeout_s: float = 30.0,
) -> dict[str, BrokerInfo]:
    """The registrations under /txb/brokers/ (by key) once ``check(registrations)`` holds."""
    now = await wait_for_registrations(coordinator_url, lambda r: check(r.brokers), timeout_s)
    return now.brokers
