"""Shared fixtures. Tests use real files, real processes and (later) real servers."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from txbroker.runtime import brokerproc
from txbroker.store import FlushMode, MessageStore, StoreConfig

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The service-database fixtures (sqlite_url, pg_url, engine) for every suite that needs them.
pytest_plugins = ["tests.databases", "tests.browser"]
ROOT = Path(__file__).resolve().parents[1]

# The tests' Spark JVMs (the session's, and those of child processes, which inherit this) run
# seconds-long jobs on small data, where C2's compiler threads and a parallel collector cost more
# CPU than they save, CPU the other workers' tests wait for (docs/benchmarks.md, "The test suite").
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


def run_cli(
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``txbroker ARGS`` as a user would: a real process, its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "txbroker.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def free_port() -> int:
    """A free loopback port, for a server a test starts on it later (or starts again after a
    kill). Taken below the kernel's ephemeral range: an outgoing connection of any process,
    another xdist worker's say, may take a port from that range before the server binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(100):
        port = random.randrange(max(low - 12_000, 1024), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free loopback port below the ephemeral range")


def small_config(data_dir: Path, **overrides: object) -> StoreConfig:
    """A store with small files, so rolling, retention and rebuilds happen in tests quickly."""
    kw: dict[str, object] = {
        "segment_bytes": 256 * 1024,
        "max_body_bytes": 64 * 1024,
        "cq_entries_per_file": 1000,
        "index_slots": 257,
        "index_capacity": 5000,
        "flush": FlushMode.SYNC,
    }
    kw.update(overrides)
    return StoreConfig(data_dir, **kw)  # type: ignore[arg-type]


OpenStore = Callable[..., Awaitable[MessageStore]]


@pytest.fixture
async def open_store(tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Open stores on ``tmp_path/store`` (or a given dir); every one still open is closed."""
    opened: list[MessageStore] = []

    async def _open(data_dir: Path | None = None, **overrides: object) -> MessageStore:
        store = await MessageStore.open(small_config(data_dir or tmp_path / "store", **overrides))
        opened.append(store)
        return store

    yield _open
    for s in opened:
        await s.close()


class BrokerProcess(brokerproc.BrokerProcess):
    """A real `txbroker serve` child process on free ports, with small files: every test
    broker preallocates its segments and index files, and the defaults (256 MiB + 52 MiB,
    twice) would fill a CI disk over a whole run."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        super().__init__(
            data_dir, "--segment-mib", "8", *extra, env={"TXB_INDEX_CAPACITY": "65536"}
        )


# Spark's work takes both cores while a job runs, so it runs on two workers of ``make test``
# (``--dist loadgroup``), one test at a time on each: the tests of the session (the ``spark``
# fixture, one JVM for all of them) on one, the jobs in child processes (spark-submit, the
# standalone cluster, ``reconcile --every``, the demo) on the other.
SPARK_SESSION, SPARK_CHILDREN = "spark-session", "spark-children"
spark_children = pytest.mark.xdist_group(SPARK_CHILDREN)


def _worker_group(item: pytest.Item) -> str | None:
    """The xdist group of a test not marked with one: Spark's as above; the module's for tests
    that share a module-scoped fixture (a broker, a world), which a worker then builds once;
    one Chromium's for the pages' tests."""
    fixtures = getattr(item, "_fixtureinfo", None)
    if fixtures is None:
        return None
    names = fixtures.names_closure
    if "spark" in names:
        return SPARK_SESSION
    if "spark_jars" in names:
        return SPARK_CHILDREN
    for name, defs in fixtures.name2fixturedefs.items():
        if defs and defs[-1].scope == "module" and name in names:
            return item.nodeid.split("::", 1)[0]
    if "browser" in names:
        return "browser"
    return None


def pytest_sessionstart(session: pytest.Session) -> None:
    # An extension module older than its source still imports: the tests would test old code.
    from txbroker.runtime.build import BUILD

    if BUILD.stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(BUILD.stale)}; "
            "run `make compiled` (or `make pure` to run them as Python)",
            returncode=4,
        )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and (group := _worker_group(item)):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker").start()
    yield b
    b.stop()
