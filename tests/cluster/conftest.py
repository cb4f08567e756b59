"""A real etcd for the coordination tests: Debian's ``/usr/bin/etcd`` (package ``etcd-server``)
on free loopback ports (below the ephemeral range: a restarted etcd binds them again) with a
data directory under ``tmp_path``, started per test that asks for it and killed at teardown,
stopped (SIGSTOP) or not.

``net`` gives a test hosts of its own, each in a Linux network namespace
(txbroker/chaos/netns.py), for partitions that cut links rather than freeze processes.
``spark`` is the reconciliation suite's one local session (tests/reconcile/conftest.py), for
the partition scenarios' reconciliation.

By hand the tests skip when etcd or the ``aetcd`` client is missing; with CI=true they fail
instead (as PostgreSQL's and Chromium's fixtures do, tests/databases.py, tests/browser.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, free_port
from tests.reconcile.conftest import spark, spark_jars
from txbroker.chaos import netns
from txbroker.chaos.netns import TestNet
from txbroker.runtime.etcdproc import ETCD_BIN, EtcdServer

__all__ = ["ETCD_BIN", "EtcdServer", "TestNet", "free_port", "spark", "spark_jars"]


def _require_etcd() -> None:
    missing = []
    if not ETCD_BIN.exists():
        missing.append(f"{ETCD_BIN} (apt-get install etcd-server)")
    try:
        import aetcd  # noqa: F401
    except ImportError:
        missing.append("the aetcd client (pip install -e '.[cluster]')")
    if missing:
        message = "etcd tests need " + " and ".join(missing)
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A started etcd of this test's own; killed afterwards, whatever the test did to it."""
    _require_etcd()
    server = EtcdServer(tmp_path / "etcd")
    # Ports a restart binds again (EtcdServer's own come from the ephemeral range).
    server.client_port, server.peer_port = free_port(), free_port()
    try:
        yield server.start()
    finally:
        server.kill()


def _require_netns() -> None:
    """Test hosts need root, iproute2 and iptables (``make system`` installs them): skipped by
    hand without them, failed under CI=true, which runs as root and must run them."""
    why = netns.unavailable()
    if why is not None:
        message = f"test hosts in network namespaces: {why}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def net() -> Iterator[TestNet]:
    """A test network of this test's own (txbroker/chaos/netns.py): hosts with addresses of
    their own on a private /24; every namespace, veth and bridge removed afterwards, whatever
    the test did."""
    _require_netns()
    _require_etcd()
    with TestNet() as n:
        yield n


@pytest.fixture
def can_make_nets() -> None:
    """For a test whose test nets a child process makes (a `txbroker` command): skipped or
    failed where ``net`` would be."""
    _require_netns()
    _require_etcd()
