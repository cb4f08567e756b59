"""What a broker's commit log holds, read from its files (a running broker's too): a slave of an
elected group serves no consumers, so tests look at its log directly."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Final

from txbroker.store import PROP_KEYS
from txbroker.store.commitlog import read_log_files

__all__ = ["keys_in_log", "wait_keys"]

READ_TIMEOUT_S: Final = 30.0
POLL_S: Final = 0.1  # a slave's log grows on its own schedule: looked at again this often


def keys_in_log(data_dir: Path, topic: str) -> list[str]:
    """The keys of ``topic``'s messages in the broker's log, in log order."""
    return [
        k
        for rec in read_log_files(data_dir / "store" / "commitlog")
        if rec.topic == topic
        for k in rec.properties.get(PROP_KEYS, "").split()
    ]


async def wait_keys(data_dir: Path, topic: str, at_least: int) -> list[str]:
    """:func:`keys_in_log` once it holds ``at_least`` keys (bounded: ``READ_TIMEOUT_S``)."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    while True:
        keys = await asyncio.to_thread(keys_in_log, data_dir, topic)
        if len(keys) >= at_least:
            return keys
        assert time.monotonic() < deadline, f"{data_dir}: {len(keys)} of {at_least} keys"
        await asyncio.sleep(POLL_S)
