"""The coordinator's task-free PREPARE and END_TX (``prepare_nowait``, ``end_nowait``), which the
broker's connections call for those opcodes: the outcome hangs on the group commit, never on
whoever waits for the answer, and every case that must wait or read is left to the async path.

In process (a broker server on a temporary directory, sync flush, no client), because these are
the states a TCP client can only hit by timing luck: an answer whose waiter has gone, and an
END_TX arriving while its PREPARE's group commit is still running.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from txbroker.errors import ReplicationTimeout, TransactionConflict
from txbroker.protocol.messages import TxEndResponse, TxPrepareRequest
from txbroker.server.app import BrokerServer
from txbroker.server.config import ServerConfig
from txbroker.server.deletion import _roll_back_topic
from txbroker.server.replication.master import ReplicaTracker
from txbroker.store.config import FlushMode
from txbroker.tx import coordinator as coordinator_module
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.state import CheckRecord, Decision, Resolver, TxState

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


async def test_the_outcome_hangs_on_the_group_commit_not_on_the_answer(
    coordinator: TxCoordinator,
) -> None:
    # An idle store starts a group commit for the first append; the next two share the next
    # one (one future, as sends do). Nobody waits for the answers here: what a client that
    # went away leaves behind.
    prepared = [coordinator.prepare_nowait(_prepare()) for _ in range(3)]
    assert all(p is not None and isinstance(p[1], asyncio.Future) for p in prepared)
    assert prepared[1] is not None and prepared[2] is not None
    assert prepared[2][1] is prepared[1][1]
    tx_id = prepared[1][0].tx_id
    await _synced(coordinator)
    assert coordinator.counters["prepared"] == 3
    assert coordinator.get(tx_id).state is TxState.PREPARED  # open, and so back-checked
    assert coordinator.get(tx_id).pending is None

    ended = coordinator.end_nowait(tx_id, Decision.COMMIT, Resolver.PRODUCER)
    assert ended is not None and isinstance(ended[1], asyncio.Future)
    assert ended[0].state == "committed" and not ended[0].duplicate
    await _synced(coordinator)
    assert coordinator.counters["committed"] == 1
    assert coordinator._store.queue_range("orders", 0) == (0, 1)  # the visible copy
    # The same decision again is answered at once; the other one is refused.
    again = coordinator.end_nowait(tx_id, Decision.COMMIT, Resolver.PRODUCER)
    assert again is not None and again[1] is None
    assert again[0] == TxEndResponse(tx_id, "committed", "producer", duplicate=True)
    with pytest.raises(TransactionConflict):
        coordinator.end_nowait(tx_id, Decision.ROLLBACK, Resolver.PRODUCER)


async def test_what_must_wait_or_read_is_left_to_the_async_path(
    coordinator: TxCoordinator,
) -> None:
    prepared = coordinator.prepare_nowait(_prepare("tx-1"))
    assert prepared is not None and isinstance(prepared[1], asyncio.Future)
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
    assert prepared[0].message_id == retried.message_id
    # An id the broker does not hold in memory: only the async path reads the index.
    assert coordinator.end_nowait("tx-unknown", Decision.COMMIT, Resolver.PRODUCER) is None
    # An ended id is left to the async path, which refuses it; nothing new is written for it.
    assert coordinator.prepare_nowait(_prepare("tx-1")) is None
    with pytest.raises(TransactionConflict):
        await coordinator.prepare(_prepare("tx-1"))
    assert coordinator._store.queue_range("orders", 0) == (0, 1)


async def test_an_ended_transaction_is_kept_as_an_untracked_record(
    coordinator: TxCoordinator,
) -> None:
    """What the broker keeps of its recently ended transactions answers everything a Tx did
    (repeated decisions, the listings, the console's copy of it), and the garbage collector
    stops walking it."""
    committed = await coordinator.prepare(_prepare("tx-c"))
    coordinator.get("tx-c").record_check(CheckRecord(1_000, "unknown", "not yet", 0.25))
    await coordinator.prepare(_prepare("tx-r"))
    await coordinator.end("tx-c", Decision.COMMIT, Resolver.PRODUCER)
    await coordinator.end("tx-r", Decision.ROLLBACK, Resolver.OPERATOR, "by hand")

    # A collection untracks a tuple of untracked values; one that holds tuples (the check
    # history) may need a second, which sees them untracked.
    gc.collect()
    gc.collect()
    for tx_id in ("tx-c", "tx-r"):
        assert not gc.is_tracked(coordinator._recent[tx_id])
    tx = coordinator.get("tx-c")
    assert (tx.state, tx.resolved_by, tx.topic, tx.key) == (
        TxState.COMMITTED,
        "producer",
        "orders",
        "o1",
    )
    assert tx.message_id == committed.message_id and tx.ended and tx.resolved_ms > 0
    assert tx.history is not None
    assert list(tx.history) == [CheckRecord(1_000, "unknown", "not yet", 0.25)]
    info = coordinator.info(coordinator.get("tx-r"))
    assert (info.state, info.resolved_by, info.last_reason) == (
        "rolled_back",
        "operator",
        "by hand",
    )

    assert [t.tx_id for t in coordinator.ended(10)] == ["tx-r", "tx-c"]  # newest first
    assert [t.tx_id for t in coordinator.ended(10, state=TxState.COMMITTED)] == ["tx-c"]
    assert [t.tx_id for t in coordinator.ended(10, by=Resolver.OPERATOR)] == ["tx-r"]
    assert [t.tx_id for t in coordinator.ended(1, key="o1")] == ["tx-r"]
    assert coordinator.ended(10, state=TxState.PREPARED) == []
    assert coordinator.ended(10, topic="other") == []

    again = await coordinator.end("tx-c", Decision.COMMIT, Resolver.PRODUCER)
    assert again == TxEndResponse("tx-c", "committed", "producer", duplicate=True)
    with pytest.raises(TransactionConflict, match="rolled_back"):
        await coordinator.end("tx-r", Decision.COMMIT, Resolver.PRODUCER)
    with pytest.raises(TransactionConflict, match="committed"):
        await coordinator.prepare(_prepare("tx-c"))


async def test_a_transaction_no_longer_kept_is_answered_from_its_decision_record(
    coordinator: TxCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_module, "RECENT_MAX", 1)
    for tx_id in ("tx-1", "tx-2"):
        await coordinator.prepare(_prepare(tx_id))
        await coordinator.end(tx_id, Decision.ROLLBACK, Resolver.OPERATOR, "by hand")
    assert coordinator.find("tx-1") is None  # only tx-2 is kept
    assert coordinator.end_nowait("tx-1", Decision.ROLLBACK, Resolver.PRODUCER) is None
    again = await coordinator.end("tx-1", Decision.ROLLBACK, Resolver.PRODUCER)
    assert again == TxEndResponse("tx-1", "rolled_back", "operator", duplicate=True)
    with pytest.raises(TransactionConflict):
        await coordinator.end("tx-1", Decision.COMMIT, Resolver.PRODUCER)


async def test_a_write_the_slaves_did_not_confirm_stands_and_a_takeover_asks_the_log(
    coordinator: TxCoordinator,
) -> None:
    """With sync replication (the master's real gate, no slave reporting until the test says
    so), a PREPARE or END_TX whose wait for the slaves timed out is in the log all the same: it
    stands, unconfirmed, and a repeat is answered only once the slaves hold it. A takeover
    forgets the unconfirmed decision it kept: the log it begins with answers."""
    store = coordinator._store
    tracker = store.replication_gate = ReplicaTracker(store, min_insync=1, timeout_s=0.3)

    async def end(decision: Decision = Decision.COMMIT) -> TxEndResponse:
        return await asyncio.wait_for(coordinator.end("tx-1", decision, Resolver.PRODUCER), 10)

    try:
        with pytest.raises(ReplicationTimeout):
            await asyncio.wait_for(coordinator.prepare(_prepare("tx-1")), 10)
        tx = coordinator.get("tx-1")
        assert (tx.state, tx.unconfirmed) == (TxState.PREPARED, True)
        assert coordinator.counters["prepared"] == 1  # open, and so back-checked when due
        with pytest.raises(ReplicationTimeout):  # a resend waits for the slaves, in vain
            await asyncio.wait_for(coordinator.prepare(_prepare("tx-1")), 10)
        tracker.report("s1", store.write_offset)
        retried = await asyncio.wait_for(coordinator.prepare(_prepare("tx-1")), 10)
        assert retried.message_id == tx.message_id
        await asyncio.sleep(0)  # the confirmation is a callback of the wait that answered
        assert not tx.unconfirmed

        with pytest.raises(ReplicationTimeout):
            await end()
        ended = coordinator.get("tx-1")
        assert (ended.state, ended.unconfirmed) == (TxState.COMMITTED, True)
        assert coordinator.listing(None, None) == []  # ended, not open again
        repeat = coordinator.end_nowait("tx-1", Decision.COMMIT, Resolver.PRODUCER)
        assert repeat is not None and repeat[1] is not None  # held for the slaves
        with pytest.raises(ReplicationTimeout):
            await asyncio.wait_for(asyncio.shield(repeat[1]), 10)
        with pytest.raises(TransactionConflict):
            await end(Decision.ROLLBACK)
        assert store.queue_range("orders", 0) == (0, 1)  # one visible copy, nothing more

        # A takeover (failover.py): no gate while the transactions are rebuilt, then a new
        # term's, which counts as covered what the last master said its slaves held.
        store.replication_gate = None
        await asyncio.wait_for(coordinator.recover(from_start=True), 10)
        tracker = store.replication_gate = ReplicaTracker(
            store, min_insync=1, timeout_s=0.3, covered=tracker.covered
        )
        assert coordinator.find("tx-1") is None  # not kept: the index answers
        assert coordinator.end_nowait("tx-1", Decision.COMMIT, Resolver.PRODUCER) is None
        with pytest.raises(ReplicationTimeout):  # found in the log, not yet on a slave
            await end()
        tracker.report("s1", store.write_offset)
        assert await end() == TxEndResponse("tx-1", "committed", "producer", duplicate=True)
        assert store.queue_range("orders", 0) == (0, 1)
    finally:
        store.replication_gate = None


async def test_an_open_transaction_a_takeover_rebuilds_past_the_slaves_is_unconfirmed(
    coordinator: TxCoordinator,
) -> None:
    """A new master counts as on its slaves only what the last master said they held: an open
    transaction whose half lies past that is rebuilt unconfirmed, so a resent PREPARE is not
    acknowledged before a slave holds the half; one below it is answered at once."""
    store = coordinator._store
    await asyncio.wait_for(coordinator.prepare(_prepare("below")), 10)
    covered = store.write_offset
    await asyncio.wait_for(coordinator.prepare(_prepare("past")), 10)
    # The takeover (failover.py): rebuilt with no gate, then the new term's gate.
    await asyncio.wait_for(coordinator.recover(from_start=True, covered=covered), 10)
    tracker = store.replication_gate = ReplicaTracker(
        store, min_insync=1, timeout_s=0.3, covered=covered
    )
    try:
        assert not coordinator.get("below").unconfirmed
        assert coordinator.get("past").unconfirmed
        await asyncio.wait_for(coordinator.prepare(_prepare("below")), 10)  # answered at once
        with pytest.raises(ReplicationTimeout):  # on this broker alone, as far as it knows
            await asyncio.wait_for(coordinator.prepare(_prepare("past")), 10)
        tracker.report("s1", store.write_offset)
        await asyncio.wait_for(coordinator.prepare(_prepare("past")), 10)
        await asyncio.sleep(0)  # the confirmation is a callback of the wait that answered
        assert not coordinator.get("past").unconfirmed
    finally:
        store.replication_gate = None


async def test_a_deleted_topics_rollback_the_slaves_did_not_confirm_is_counted(
    coordinator: TxCoordinator,
) -> None:
    """Deleting a topic rolls back its open transactions; a rollback whose wait for the slaves
    timed out stands (unconfirmed) and is one of those rolled back, not one "ended otherwise"."""
    store = coordinator._store
    await asyncio.wait_for(coordinator.prepare(_prepare("tx-d")), 10)
    store.replication_gate = ReplicaTracker(store, min_insync=1, timeout_s=0.3)  # no slave
    try:
        rolled_back = await asyncio.wait_for(_roll_back_topic(coordinator, "orders"), 10)
        tx = coordinator.get("tx-d")
        assert (tx.state, tx.unconfirmed, rolled_back) == (TxState.ROLLED_BACK, True, 1)
    finally:
        store.replication_gate = None
