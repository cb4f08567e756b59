"""A read the disk fails (EIO from a dying disk, say) is a store error that names the record
and the file, answered as any store error: not an unexpected exception that the broker's request
path and the console would turn into INTERNAL or a 500."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import small_config
from txbroker.errors import StoreError
from txbroker.store import Message, MessageStore


async def test_a_read_the_disk_fails_is_a_store_error_naming_the_record(tmp_path: Path) -> None:
    # hot_read_bytes=0: every read is a cold one, with pread, from a worker thread.
    store = await MessageStore.open(small_config(tmp_path / "s", hot_read_bytes=0))
    try:
        stored = await store.append(Message("t", b"x"))
        seg = store.log.segments[0]
        good = seg.fd
        # pread on a directory fails with EISDIR: an OSError from the read as EIO would be,
        # which no file of the log can be made to return on demand.
        broken = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        seg.fd = broken
        try:
            with pytest.raises(StoreError) as failed:
                await store.read(stored.physical_offset)
        finally:
            seg.fd = good
            os.close(broken)
        assert f"physical offset {stored.physical_offset} from {seg.path} failed" in str(
            failed.value
        )
        assert "Is a directory" in str(failed.value)  # the OSError's own words
        assert (await store.read(stored.physical_offset)).body == b"x"  # nothing else broke
    finally:
        await store.close()
