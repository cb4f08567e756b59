"""Kill -9 the broker while producers send with sync flush, several rounds: afterwards every
acknowledged message is consumed; none is lost."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess
from txbroker.errors import TxbError
from txbroker_sdk import Client, Consumer

ROUNDS = 4
PRODUCERS = 8


@pytest.mark.slow
async def test_sigkill_under_load_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data = tmp_path / "broker"
    rng = random.Random(7)
    acked: set[bytes] = set()
    seq = itertools.count()
    b = BrokerProcess(data).start()
    async with await Client.connect(b.url) as admin:
        await admin.create_topic("load", queues=4)
    for _ in range(ROUNDS):
        target = rng.randint(200, 2000)

        async def producer(url: str) -> None:
            async with await Client.connect(url) as c:
                while len(acked) < 10**9:
                    body = f"m{next(seq)}".encode()
                    await c.send("load", body, key=body.decode())
                    acked.add(body)

        before = len(acked)
        tasks = [asyncio.create_task(producer(b.url)) for _ in range(PRODUCERS)]
        deadline = time.monotonic() + 60
        while len(acked) - before < target:
            assert time.monotonic() < deadline, "producers made no progress"
            assert not all(t.done() for t in tasks), [t.exception() for t in tasks]
            await asyncio.sleep(0.01)  # polling a counter, not synchronising on an event
        b.kill()  # SIGKILL mid-stream: sends in flight get no answer
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, TxbError) for r in results), results
        b = BrokerProcess(data).start()
    try:
        async with await Client.connect(b.url) as c, Consumer(c, "audit", "load") as consumer:
            seen: set[bytes] = set()
            deadline = time.monotonic() + 60
            while not acked <= seen:
                assert time.monotonic() < deadline, f"missing {len(acked - seen)} acked messages"
                for m in await consumer.fetch(timeout_ms=500):
                    seen.add(m.body)
                    m.ack()
        assert acked <= seen and len(acked) >= ROUNDS * 200
    finally:
        b.stop()
