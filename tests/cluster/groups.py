"""A cluster of broker groups for tests: real brokers (``BrokerProcess`` with ``--group`` and
``--coordinator``) and NameServers (``txbroker nameserver``) as child processes on free
loopback ports, and waits on what etcd holds (a watch, bounded), never on sleeps."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from txbroker.cluster import connect_coordinator
from txbroker.cluster.coordination import EventKind
from txbroker.cluster.routes import BROKERS_PREFIX, BrokerInfo, choose_masters
from txbroker.nameserver import READY_PREFIX

START_TIMEOUT_S: Final = 30.0
# A broker campaigning with --role auto wins an uncontested election in one round trip to etcd;
# 15 s covers a loaded 2-core runner.
MASTERS_TIMEOUT_S: Final = 15.0


class NameServerProcess:
    """`txbroker nameserver --coordinator URL --port 0`; ``url`` is its txb:// address."""

    def __init__(self, coordinator: str, log_path: Path) -> None:
        self.coordinator = coordinator
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""  # host:port

    def start(self) -> NameServerProcess:
        cmd = [sys.executable, "-m", "txbroker.cli", "nameserver"]
        cmd += ["--coordinator", self.coordinator, "--port", "0"]
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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


async def wait_for_brokers(
    coordinator_url: str,
    done: Callable[[dict[str, BrokerInfo]], bool],
    timeout_s: float = MASTERS_TIMEOUT_S,
) -> dict[str, BrokerInfo]:
    """The registrations under /txb/brokers/ (by key) once ``done`` holds of them: listed, then
    followed by a watch from the listing's revision, within ``timeout_s``."""
    async with await connect_coordinator(coordinator_url) as coordinator:
        listing = await coordinator.list_prefix(BROKERS_PREFIX)
        brokers = {kv.key: BrokerInfo.from_json(kv.value) for kv in listing.items}
        if done(brokers):
            return brokers
        async with asyncio.timeout(timeout_s):
            async with coordinator.watch_prefix(
                BROKERS_PREFIX, start_revision=listing.revision + 1
            ) as events:
                async for event in events:
                    if event.kind is EventKind.DELETE:
                        brokers.pop(event.key, None)
                    else:
                        brokers[event.key] = BrokerInfo.from_json(event.value)
                    if done(brokers):
                        return brokers
    raise AssertionError("the watch ended")


def masters_of(*groups: str) -> Callable[[dict[str, BrokerInfo]], bool]:
    """``done`` for :func:`wait_for_brokers`: each of ``groups`` has a master registered."""
    return lambda brokers: set(groups) <= set(choose_masters(brokers.values()))
