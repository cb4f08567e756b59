"""Restart cost bounded by open transactions, not by their age: with one old open transaction
and 12,000 later ones resolved, the broker copies the old half forward and a restart reads a
few %HALF records instead of all of them; and a crash between that copy and the state file
(two half records of one transaction) still gives one transaction, committed once."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from pathlib import Path

from tests.conftest import BrokerProcess
from tests.tx.conftest import GROUP, CheckServer, tx_broker
from txbroker.protocol.ids import new_id
from txbroker_sdk import Client, Consumer

RESOLVED = 12_000  # past the 10,000-record span that triggers a copy (COMPACT_MIN_SPAN)
PRODUCERS = 32


def state(data: Path) -> dict[str, object]:
    path = data / "meta" / "tx.json"
    got: dict[str, object] = json.loads(path.read_bytes()) if path.exists() else {}
    return got


def halves_read(b: BrokerProcess) -> int:
    """What the newest start's recovery read, from its log line."""
    found = re.findall(
        r"open after recovery \((\d+) half and \d+ op records read in", b.log_path.read_text()
    )
    assert found, "no recovery line in the broker's log"
    return int(found[-1])


async def wait_for(cond: object, what: str, timeout_s: float = 30) -> None:
    assert callable(cond)
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)  # the broker's housekeeping runs on its own clock


async def resolve_many(c: Client, url: str, n: int) -> None:
    """n transactions prepared and ended at once (a tenth rolled back), by PRODUCERS tasks."""
    left = iter(range(n))

    async def producer() -> None:
        for i in left:
            tx = await c.prepare(
                "orders", b"o", producer_group=GROUP, check_url=url, timeout_ms=60_000
            )
            await (tx.rollback() if i % 10 == 0 else tx.commit())

    await asyncio.gather(*(producer() for _ in range(PRODUCERS)))


async def test_restart_reads_few_halves_with_one_old_open_transaction_and_survives_a_crash(
    tmp_path: Path, checks: CheckServer
) -> None:
    data = tmp_path / "b"
    b = tx_broker(data).start()
    old_id = new_id()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=4)
            await c.create_topic("old", queues=1)
            await c.prepare(
                "old",
                b"old order",
                producer_group=GROUP,
                check_url=checks.url,
                tx_id=old_id,
                timeout_ms=24 * 3600 * 1000,  # open all along: no check is due
            )
            await wait_for(lambda: old_id in str(state(data)), "no state file with the old one")
            # As a crash would leave it if it came after the copy but before the next state file.
            before_copy = data.parent / "tx.json.before-copy"
            shutil.copy(data / "meta" / "tx.json", before_copy)
            assert state(data)["half_low"] == 0
            await resolve_many(c, checks.url, RESOLVED)
            await wait_for(lambda: state(data)["half_low"] != 0, "the old half was not copied")
            assert (await c.list_transactions()).total == 1
        b.kill()
        b = tx_broker(data).start()
        bounded = halves_read(b)
        # The copy, and the halves prepared after it (the copy may come mid-load, at most
        # 2,000 before the end: it leaves 5,000 of the span where it is).
        assert 1 <= bounded <= 2_001
        async with await Client.connect(b.url) as c:
            assert [t.tx_id for t in (await c.list_transactions()).transactions] == [old_id]
        b.kill()
        # Kill -9 right after the copy: the state file from before it, both halves in the log.
        shutil.copy(before_copy, data / "meta" / "tx.json")
        b = tx_broker(data).start()
        assert halves_read(b) >= RESOLVED + 2  # what every restart read before the copies
        async with await Client.connect(b.url) as c:
            listed = await c.list_transactions()
            assert [t.tx_id for t in listed.transactions] == [old_id]  # one, the later copy
            assert not (await c.end_transaction(old_id, "commit")).duplicate
        assert b.stop() == 0
        b = tx_broker(data).start()
        async with await Client.connect(b.url) as c:
            assert (await c.list_transactions()).total == 0
            assert (await c.end_transaction(old_id, "commit")).duplicate
            async with Consumer(c, "g", "old") as consumer:
                got = []
                while batch := await consumer.fetch(timeout_ms=700):
                    got += [m.body for m in batch]
            assert got == [b"old order"]  # committed once
    finally:
        b.stop()
