"""Child process for the kill -9 test: appends with sync flush and reports each acknowledged
append on stdout as "seq queue_id queue_offset physical_offset". Run as
``python -m tests.store._appender DATA_DIR FIRST_SEQ [NAME=INT ...]``, each NAME=INT a
``StoreConfig`` field to override."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from tests.conftest import small_config
from txbroker.store import Message, MessageStore


def body_for(seq: int) -> bytes:
    """Deterministic body whose length varies, so records straddle pages and segments."""
    return (f"<{seq}>".encode() * (seq % 700 + 1))[: seq % 9000 + 1]


async def main(data_dir: Path, first: int, overrides: dict[str, int]) -> None:
    store = await MessageStore.open(
        small_config(data_dir, **{"segment_bytes": 1024 * 1024, **overrides})
    )
    os.write(1, b"READY\n")
    counter = iter(range(first, first + 10_000_000))

    async def appender() -> None:
        while True:
            seq = next(counter)
            res = await store.append(
                Message("crash", body_for(seq), queue_id=seq % 4, properties={"keys": f"s{seq}"})
            )
            os.write(1, f"{seq} {res.queue_id} {res.queue_offset} {res.physical_offset}\n".encode())

    await asyncio.gather(*(appender() for _ in range(16)))


if __name__ == "__main__":
    named = dict(arg.split("=", 1) for arg in sys.argv[3:])
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), {k: int(v) for k, v in named.items()}))
