"""Kill -9 the broker while transactions are in every phase, several rounds: each one ends
committed-and-delivered-once or rolled-back-and-never-delivered, as its service decided."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import free_port
from tests.httpserver import serve_app
from tests.tx.conftest import GROUP, SECRET, tx_broker
from txbroker.errors import TxbError
from txbroker.protocol.ids import new_id
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus
from txbroker_sdk import Client, Consumer

ROUNDS = 4
PRODUCERS = 6


class Service:
    """The producer service's database, reduced to its barrier table: the first decision
    recorded for a transaction wins, whether the business code or a check-back records it."""

    def __init__(self) -> None:
        self.decided: dict[str, CheckStatus] = {}

    def decide(self, tx_id: str, want: CheckStatus) -> CheckStatus:
        return self.decided.setdefault(tx_id, want)

    def check(self, req: CheckRequest) -> CheckStatus:
        # A check for a transaction the service never committed rolls it back (and fences
        # the business code, which will find ROLLBACK when it tries to commit).
        return self.decide(req.tx_id, CheckStatus.ROLLBACK)


@pytest.mark.slow
async def test_sigkill_with_transactions_in_every_phase(tmp_path: Path) -> None:
    rng = random.Random(42)
    service = Service()
    app = Starlette(
        routes=[Route("/c", CheckbackEndpoint(service.check, {GROUP: SECRET}), methods=["POST"])]
    )
    port = free_port()  # each restart binds it again
    data = tmp_path / "broker"
    broker = tx_broker(data, "--port", str(port)).start()
    async with serve_app(app) as base:
        url = base + "/c"
        async with await Client.connect(broker.url) as admin:
            await admin.create_topic("pay", queues=4)
        stop = asyncio.Event()
        phases: Counter[str] = Counter()

        async def producer(seed: int) -> None:
            prng = random.Random(seed)
            async with await Client.connect(broker.url, reconnect_s=30) as c:
                while not stop.is_set():
                    tx_id = new_id()
                    try:
                        tx = await c.prepare(
                            "pay", tx_id.encode(), producer_group=GROUP, check_url=url, tx_id=tx_id
                        )
                    except TxbError:
                        phases["prepare lost"] += 1
                        continue  # maybe stored, never decided: a check will roll it back
                    roll = prng.random()
                    want = CheckStatus.COMMIT if roll < 0.6 else CheckStatus.ROLLBACK
                    decided = service.decide(tx_id, want)  # the local DB transaction
                    if roll > 0.9:
                        phases["no END_TX"] += 1
                        continue  # the process "dies" after its DB commit: checks decide
                    try:
                        if decided is CheckStatus.COMMIT:
                            await tx.commit()
                        else:
                            await tx.rollback()
                        phases["ended"] += 1
                    except TxbError:
                        phases["END_TX lost"] += 1  # left to the back-check

        for _ in range(ROUNDS):
            stop.clear()
            tasks = [asyncio.create_task(producer(rng.random())) for _ in range(PRODUCERS)]
            await asyncio.sleep(rng.uniform(0.5, 1.5))  # let traffic run: the kill lands mid-flow
            broker.kill()
            await asyncio.sleep(0.2)  # producers see the connection drop and start reconnecting
            broker = tx_broker(data, "--port", str(port)).start()
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            async with await Client.connect(broker.url) as c:
                deadline = time.monotonic() + 60
                while (await c.list_transactions()).total:
                    assert time.monotonic() < deadline, "transactions left unresolved"
                    await asyncio.sleep(0.2)  # back-checks resolving the stragglers
                delivered: list[bytes] = []
                async with Consumer(c, "audit", "pay", max_messages=500) as consumer:
                    while True:
                        batch = await consumer.fetch(timeout_ms=1000)
                        if not batch:
                            break
                        for m in batch:
                            delivered.append(m.body)
                            m.ack()
        finally:
            broker.stop()
    counts = Counter(b.decode() for b in delivered)
    committed = {t for t, d in service.decided.items() if d is CheckStatus.COMMIT}
    assert [t for t, n in counts.items() if n > 1] == []  # nothing twice
    assert set(counts) == committed  # every commit delivered, no rollback delivered
    assert len(committed) > 100 and phases["no END_TX"] > 0, phases
