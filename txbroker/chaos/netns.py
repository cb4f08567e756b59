"""Test hosts with addresses of their own: each one a Linux network namespace joined to a bridge
by a veth pair, on a private /24 (``10.231.N.0/24``). This process stays in the root namespace
and reaches every host through the bridge, where it has the subnet's first address (``.1``).
Processes run in a host with its :meth:`Host.run_prefix` (``ip netns exec NS``: the command's
own pid, so signals reach it); links between hosts are cut with iptables inside a host's
namespace (:mod:`txbroker.chaos.nemesis`), which go with the namespace.

    with TestNet() as net:
        etcd = net.host("etcd")  # etcd.address == "10.231.N.2"
        subprocess.Popen([*etcd.run_prefix, "etcd", ...])

Names carry a per-net prefix ``tn<pid:06x><seq:x>`` (interface names are at most 15 bytes), so
parallel test workers never collide, and a new net first removes what nets of dead processes
left behind (a worker killed before its teardown ran). Needs root and ``ip`` (iproute2);
:func:`unavailable` says why not.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["Host", "TestNet", "unavailable"]

SUBNETS: Final = ipaddress.IPv4Network("10.231.0.0/16")  # a private range no CI network uses
PREFIX_RE: Final = re.compile(r"^tn([0-9a-f]{6})[0-9a-f]")
# Chosen subnets are looked up and claimed under this lock: two workers never take one /24.
LOCK_PATH: Final = Path("/tmp/txbroker-netns.lock")
IP_TIMEOUT_S: Final = 30.0  # one `ip` or `iptables` call; they take milliseconds
_seq = itertools.count()


def unavailable() -> str | None:
    """Why network namespaces cannot be made here (not root, no ``ip`` or ``iptables``), or
    None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"no {tool} (apt-get install {package})"
    return None


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One command of the net's plumbing; a failure raises with its stderr."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


@dataclass(frozen=True, slots=True)
class Host:
    """One host: its name in the test, its namespace and its address on the net."""

    name: str
    netns: str
    address: str

    @property
    def run_prefix(self) -> tuple[str, ...]:
        """Put before a command to run it in this host."""
        return ("ip", "netns", "exec", self.netns)

    def iptables(self, *args: str, check: bool = True) -> None:
        run(*self.run_prefix, "iptables", "-w", *args, check=check)


class TestNet:
    """A bridge, a /24 on it, and the hosts made with :meth:`host`; :meth:`close` removes them
    all (and stops any process still running in one)."""

    __test__ = False  # a fixture's class, not a test case, whatever pytest thinks of the name

    def __init__(self) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(why)
        self.prefix = f"tn{os.getpid():06x}{next(_seq) % 16:x}"
        self.bridge = f"{self.prefix}b"
        self.hosts: dict[str, Host] = {}
        self._links: list[str] = []
        self.subnet: ipaddress.IPv4Network | None = None

    def __enter__(self) -> TestNet:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gateway(self) -> str:
        """This process's address on the net (the bridge's): how hosts see the test's
        clients."""
        assert self.subnet is not None
        return str(self.subnet.network_address + 1)

    def open(self) -> None:
        remove_leftovers()
        with _locked():
            self.subnet = _free_subnet()
            run("ip", "link", "add", self.bridge, "type", "bridge")
            run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")

    def host(self, name: str) -> Host:
        """A new host ``name`` with the next free address of the subnet."""
        assert self.subnet is not None, "open() the net first"
        if name in self.hosts:
            raise ValueError(f"host {name!r} exists already")
        i = len(self.hosts)
        address = str(self.subnet.network_address + 2 + i)
        host = Host(name, f"{self.prefix}-{name}", address)
        outside, inside = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
        run("ip", "netns", "add", host.netns)
        self.hosts[name] = host
        run("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        self._links.append(outside)
        run("ip", "link", "set", inside, "netns", host.netns)
        run("ip", "link", "set", outside, "master", self.bridge, "up")
        ns = ("ip", "-n", host.netns)
        run(*ns, "link", "set", inside, "name", "eth0")
        run(*ns, "addr", "add", f"{address}/24", "dev", "eth0")
        run(*ns, "link", "set", "eth0", "up")
        run(*ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Everything this net made, whatever state it is in; what is gone already is no
        error."""
        for host in self.hosts.values():
            _kill_inside(host.netns)
        # The veth first: deleting a namespace frees its end of the pair only later, in the
        # background, while deleting one end deletes both now.
        for link in self._links:
            run("ip", "link", "del", link, check=False)
        for host in self.hosts.values():
            run("ip", "netns", "del", host.netns, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        self.hosts.clear()
        self._links.clear()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    with open(LOCK_PATH, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of SUBNETS no interface of this machine has an address in."""
    shown = run("ip", "-4", "-o", "addr", "show").stdout
    used = [ipaddress.ip_interface(m).network for m in re.findall(r"inet (\S+)", shown)]
    for subnet in SUBNETS.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise RuntimeError(f"every /24 of {SUBNETS} is in use: leftovers of test nets?")


def _kill_inside(netns: str) -> None:
    """SIGKILL whatever still runs in ``netns`` (the net's own children: stopped by their
    owners first, this catches only what a failed test left)."""
    pids = run("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Remove the namespaces, veths and bridges of nets whose process is gone; returns their
    names."""
    removed = []
    links = run("ip", "-o", "link", "show").stdout
    names = re.findall(r"^\d+: ([^:@\s]+)", links, flags=re.M)
    namespaces = [line.split()[0] for line in run("ip", "netns", "list").stdout.splitlines()]
    for name in namespaces + names:
        m = PREFIX_RE.match(name)
        if m is None or _alive(int(m.group(1), 16)):
            continue
        if name in namespaces:
            _kill_inside(name)
            run("ip", "netns", "del", name, check=False)
        else:
            run("ip", "link", "del", name, check=False)
        removed.append(name)
    return removed
