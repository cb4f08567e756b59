"""A real etcd for the coordination tests: Debian's ``/usr/bin/etcd`` (package ``etcd-server``)
on free loopback ports (below the ephemeral range: a restarted etcd binds them again) with a
data directory under ``tmp_path``, started per test that asks for it and killed at teardown,
stopped (SIGSTOP) or not.

By hand the tests skip when etcd or the ``aetcd`` client is missing; with CI=true they fail
instead (as PostgreSQL's and Chromium's fixtures do, tests/databases.py, tests/browser.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IN_CI, free_port
from txbroker.runtime.etcdproc import ETCD_BIN, EtcdServer

__all__ = ["ETCD_BIN", "EtcdServer", "free_port"]


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
