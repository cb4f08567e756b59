"""A cluster of broker groups for tests: real brokers (``BrokerProcess`` with ``--group`` and
``--coordinator``) and NameServers (``txbroker nameserver``) as child processes on free
loopback ports, and waits on what etcd holds (a watch, bounded), never on sleeps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from txbroker.chaos.cluster import NameServerProcess
from txbroker.chaos.cluster import wait_for_brokers as _wait_for_brokers
from txbroker.cluster.routes import BrokerInfo, choose_masters

__all__ = ["NameServerProcess", "masters_of", "wait_for_brokers"]

# A broker campaigning with --role auto wins an uncontested election in one round trip to etcd;
# 15 s covers a loaded 2-core runner.
MASTERS_TIMEOUT_S: Final = 15.0


async def wait_for_brokers(
    coordinator_url: str,
    done: Callable[[dict[str, BrokerInfo]], bool],
    timeout_s: float = MASTERS_TIMEOUT_S,
) -> dict[str, BrokerInfo]:
    """The registrations once ``done`` holds of them (bounded, ``timeout_s``)."""
    return await _wait_for_brokers(coordinator_url, done, timeout_s)


def masters_of(*groups: str) -> Callable[[dict[str, BrokerInfo]], bool]:
    """``done`` for :func:`wait_for_brokers`: each of ``groups`` has a master registered."""
    return lambda brokers: set(groups) <= set(choose_masters(brokers.values()))
