"""Shared fixtures. Tests use real files, real processes and (later) real servers."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from txbroker.store import FlushMode, MessageStore, StoreConfig

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
