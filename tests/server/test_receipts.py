"""The receiver's invisibility deadlines (``receipts.py``): one per hand-out, not per message,
and compacted once acknowledged deliveries outnumber the live ones, without losing one.

In process (a broker server on a temporary directory, its receiver called as the HTTP
endpoints call it), because the deadlines' memory is only visible from inside.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from txbroker.protocol.messages import SendRequest
from txbroker.server.app import BrokerServer
from txbroker.server.config import ServerConfig
from txbroker.server.receipts import COMPACT_MIN, MAX_RECEIVE, MAX_WAIT_MS, Receiver
from txbroker.store.config import FlushMode
from txbroker_sdk import Client

TOPIC = "orders"
STALE = COMPACT_MIN + 100  # acknowledged deliveries: past the compaction's threshold


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[BrokerServer, Receiver]]:
    config = ServerConfig(data_dir=tmp_path / "data", port=0, http_port=0, flush=FlushMode.ASYNC)
    server = BrokerServer(config)
    await server.start()
    assert server.receiver is not None
    server.topics.create(TOPIC, 1)
    try:
        yield server, server.receiver
    finally:
        await server.stop()


async def test_acknowledged_deadlines_are_compacted_and_a_live_one_still_expires(
    served: tuple[BrokerServer, Receiver], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, receiver = served
    # The sweeper compacts too, at each renewal (every RENEW_S): held off until the counts
    # before compaction are read, however long acknowledging takes on a busy machine. The
    # compaction under test is then the same method, called here at a known moment.
    compact = receiver._compact
    monkeypatch.setattr(receiver, "_compact", lambda: None)
    async with await Client.connect(f"txb://127.0.0.1:{server.port}") as c:
        for start in range(0, STALE + 1, 1000):  # STALE + 1 messages
            await c.send_batch([SendRequest(TOPIC, b"x")] * min(1000, STALE + 1 - start))
    acked = 0
    while acked < STALE:
        got = await receiver.receive(
            "g",
            TOPIC,
            max_messages=min(MAX_RECEIVE, STALE - acked),
            wait_ms=0,
            invisible_ms=600_000,
        )
        settled = await receiver.ack("g", TOPIC, [m.receipt for m in got])
        assert len(settled.applied) == len(got) > 0
        acked += len(got)
    [kept] = await receiver.receive("g", TOPIC, max_messages=1, wait_ms=0, invisible_ms=300)
    # One deadline per hand-out: a receive of 1,024 messages is one entry, not 1,024.
    assert len(receiver._deadlines) <= STALE // MAX_RECEIVE + 2
    assert receiver._scheduled == STALE + 1
    compact()
    monkeypatch.undo()
    assert receiver._scheduled == 1 and len(receiver._deadlines) == 1
    # Handed back by the sweeper within a round of it; the wait is bounded, not timed.
    [again] = await receiver.receive(
        "g", TOPIC, max_messages=1, wait_ms=MAX_WAIT_MS, invisible_ms=300
    )
    assert again.message.message_id == kept.message.message_id
    assert again.delivery_attempt == 2 and again.receipt != kept.receipt
