"""The coordinator's task-free PREPARE and END_TX (``prepare_nowait``, ``end_nowait``), which the
broker's connections call for those opcodes: the outcome hangs on the group commit, never on
whoever waits for the answer, and every case that must wait or read is left to the async path.

In process (a broker server on a temporary directory, sync flush, no client), because these are
the states a TCP client can only hit by timing luck: an answer whose waiter has gone, and an
END_TX arriving while its PREPARE's group commit is still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from txbroker.errors import TransactionConflict
from txbroker.protocol.messages import TxEndResponse, TxPrepareRequest
from txbroker.server.app import BrokerServer
from txbroker.server.config import ServerConfig
from txbroker.store.config import FlushMode
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import Decision, Resolver, TxState

GROUP = "orders-svc"
URL = "http://127.0.0.1:9/txb/check"  # never called: every transaction here ends in time


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[TxCoordinator]:
    config = ServerConfig(
        data_dir=tmp_path / "data",
        port=0,
        http_port=0,
        flush=FlushMode.SYNC,
        tx_secrets={GROUP: "s3cret"},
        tx_timeout_ms=600_000,
    )
    server = BrokerServer(config)
    await server.start()
    assert server.tx is not None and server.store is not None
    server.topics.create("orders", 1)
    try:
        yield server.tx
    finally:
        await server.stop()


async def _synced(coordinator: TxCoordinator) -> None:
    """Until everything appended so far is durable (and what hangs on it has run: those
    callbacks were registered before this waiter's)."""
    durable = coordinator._store.durable()
    assert durable is not None
    await asyncio.wait_for(durable, 10)


def _prepare(tx_id: str | None = None) -> TxPrepareRequest:
    return TxPrepareRequest("orders", b"order-1", GROUP, URL, tx_id=tx_id, key="o1")


async def test_an_abandoned_answer_does_not_undo_the_prepare_or_the_commit(
    coordinator: TxCoordinator,
) -> None:
    prepared = coordinator.prepare_nowait(_prepare())
    assert isinstance(prepared, asyncio.Future)  # sync flush: answered by the group commit
    tx_id = next(iter(coordinator.open))
    prepared.cancel()  # the client went away while its PREPARE was being synced
    await _synced(coordinator)  # the group commit still runs
    assert coordinator.counters["prepared"] == 1
    assert coordinator.get(tx_id).state is TxState.PREPARED  # open, and so back-checked

    ended = coordinator.end_nowait(tx_id, Decision.COMMIT, Resolver.PRODUCER)
    assert isinstance(ended, asyncio.Future)
    ended.cancel()
    await _synced(coordinator)
    assert coordinator.counters["committed"] == 1
    assert coordinator._store.queue_range("orders", 0) == (0, 1)  # the visible copy
    # The same decision again is answered at once; the other one is refused.
    again = coordinator.end_nowait(tx_id, Decision.COMMIT, Resolver.PRODUCER)
    assert isinstance(again, TxEndResponse) and again.duplicate
    with pytest.raises(TransactionConflict):
        coordinator.end_nowait(tx_id, Decision.ROLLBACK, Resolver.PRODUCER)


async def test_what_must_wait_or_read_is_left_to_the_async_path(
    coordinator: TxCoordinator,
) -> None:
    prepared = coordinator.prepare_nowait(_prepare("tx-1"))
    assert isinstance(prepared, asyncio.Future)
    # While the PREPARE is being synced, END_TX and a retried PREPARE must wait for it.
    assert coordinator.end_nowait("tx-1", Decision.COMMIT, Resolver.PRODUCER) is None
    assert coordinator.prepare_nowait(_prepare("tx-1")) is None
    committed, retried = await asyncio.wait_for(
        asyncio.gather(
            coordinator.end("tx-1", Decision.COMMIT, Resolver.PRODUCER),
            coordinator.prepare(_prepare("tx-1")),  # not a conflict: it ran before the commit
        ),
        10,
    )
    assert committed.state == "committed" and not committed.duplicate
    assert retried.tx_id == "tx-1"
    assert (await prepared).message_id == retried.message_id
    # An id the broker does not hold in memory: only the async path reads the index.
    assert coordinator.end_nowait("tx-unknown", Decision.COMMIT, Resolver.PRODUCER) is None
    # An ended id is left to the async path, which refuses it; nothing new is written for it.
    assert coordinator.prepare_nowait(_prepare("tx-1")) is None
    with pytest.raises(TransactionConflict):
        await coordinator.prepare(_prepare("tx-1"))
    assert coordinator._store.queue_range("orders", 0) == (0, 1)
