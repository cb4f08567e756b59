"""The broker-group commands' refusals, without etcd: each stops at once with a clear error."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import free_port
from tests.conftest import IN_CI


def _txbroker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txbroker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_nameserver_without_etcd_stops_with_the_reason() -> None:
    if not IN_CI:
        pytest.importorskip("aetcd")  # without the client the error says to install it
    dead = f"etcd://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    done = _txbroker("nameserver", "--coordinator", dead, "--port", "0")
    assert done.returncode == 2
    assert "COORDINATOR_UNAVAILABLE" in done.stderr and "127.0.0.1" in done.stderr
    assert time.monotonic() - started < 30  # the request deadline, not a hang

    done = _txbroker("nameserver")
    assert done.returncode == 2 and "--coordinator" in done.stderr


def test_group_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    done = _txbroker("serve", "--data-dir", str(tmp_path), "--group", "g1", "--port", "0")
    assert done.returncode == 2 and "coordinator and group go together" in done.stderr
    done = _txbroker(
        "serve", "--data-dir", str(tmp_path), "--group", "g1", "--coordinator", "http://x:1"
    )
    assert done.returncode == 2 and "etcd://" in done.stderr
    done = _txbroker("topic", "create", "orders", "--groups", "g1,g2")
    assert done.returncode == 2 and "--groups needs --coordinator" in done.stderr
    done = _txbroker("cluster", "forget", "g1", "b1")
    assert done.returncode == 2 and "--coordinator" in done.stderr
