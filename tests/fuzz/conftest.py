"""A broker with an admin token for the fuzz runs: token checks are fuzzed too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess

TOKEN = "fuzz-test-token"


@pytest.fixture
def token_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", "--auth-token", TOKEN).start()
    yield b
    b.stop()
