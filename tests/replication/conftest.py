"""Master and slave brokers as real processes on loopback ports; every one started is stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess

# 5 MiB segments (the smallest --segment-mib): a few hundred 16 KiB messages roll the log into
# a second segment, so replication across a segment's end is exercised every run.
SEGMENT_MIB = "5"


class Brokers:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[BrokerProcess] = []

    def master(self, name: str = "master", *extra: str) -> BrokerProcess:
        return self._start(name, "--segment-mib", SEGMENT_MIB, *extra)

    def slave(self, master: BrokerProcess, name: str = "slave", *extra: str) -> BrokerProcess:
        return self._start(name, "--segment-mib", SEGMENT_MIB, "--replica-of", master.url, *extra)

    def _start(self, name: str, *extra: str) -> BrokerProcess:
        b = BrokerProcess(self.root / name, *extra)
        self.started.append(b)
        return b.start()


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Brokers]:
    bs = Brokers(tmp_path)
    try:
        yield bs
    finally:
        for b in bs.started:
            b.stop(timeout_s=15)
