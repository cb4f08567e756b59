"""Half messages the broker copied forward (so open and parked transactions outlive retention,
txbroker/tx/halfcopy.py) are one transaction to the reconciliation: listed once, stuck or parked
as the newest of the copy and the op records after it says, with the PREPARE's time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.conftest import small_config
from txbroker.store import Message, MessageStore, RecordFlag
from txbroker.tx.halfcopy import copy_properties
from txbroker.tx.state import HALF_TOPIC, OP_TOPIC, Tx, TxState
from txbroker_reconcile.options import JobOptions, ServiceSpec
from txbroker_reconcile.run import _Progress, reconcile

HOUR_MS = 3_600_000


class Log:
    """Writes half, copy and op records as the broker's coordinator and mover do."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.created_ms = int(time.time() * 1000) - HOUR_MS
        self.ops = 0

    def _tx(self, tx_id: str, state: TxState) -> Tx:
        """The transaction as the coordinator holds it when the mover copies its half."""
        reason = "parked after 15 checks" if state is TxState.PARKED else ""
        tx = Tx(tx_id, "orders", 0, "orders-svc", "http://svc/check", f"m-{tx_id}", None, None,
                1000, self.created_ms, 0, 0, self.ops, state=state, last_reason=reason)  # fmt: skip
        return tx

    def _props(self, tx_id: str) -> dict[str, str]:
        return {
            "id": f"m-{tx_id}",
            "tx": tx_id,
            "tt": "orders",
            "tq": "0",
            "pg": "orders-svc",
            "cu": "http://svc/check",
            "to": "1000",
            "om": str(self.ops),
        }

    async def half(self, tx_id: str) -> None:
        flag = int(RecordFlag.TX_HALF)
        await self.store.append(Message(HALF_TOPIC, b"body", 0, self._props(tx_id), flag))

    async def copy(self, tx_id: str, state: TxState) -> None:
        props = copy_properties(self._props(tx_id), self._tx(tx_id, state), self.ops)
        msg = Message(HALF_TOPIC, b"body", 0, props, int(RecordFlag.TX_HALF), self.created_ms)
        await self.store.append(msg)

    async def op(self, tx_id: str, op: str) -> None:
        props = {"tx": tx_id, "op": op, "hp": "0", "by": "check", "why": ""}
        if op == "rollback":
            props["ix"] = f"txend:{tx_id}"
        await self.store.append(Message(OP_TOPIC, b"", 0, props, int(RecordFlag.TX_OP)))
        self.ops += 1

    async def commit(self, tx_id: str) -> None:
        props = {"id": f"m-{tx_id}", "tx": tx_id, "ix": f"txend:{tx_id}", "by": "producer"}
        await self.store.append(Message("orders", b"body", 0, props, int(RecordFlag.TX_COMMITTED)))


async def _write(data: Path) -> int:
    """The log of six transactions; returns their PREPARE time."""
    store = await MessageStore.open(small_config(data / "store"))
    try:
        log = Log(store)
        await log.copy("parked-op-gone", TxState.PARKED)  # its original and park op retained away
        for tx_id in ("twice", "parked-later", "resumed", "rolled-back", "committed"):
            await log.half(tx_id)
        await log.op("resumed", "park")
        for tx_id in ("twice", "parked-later", "rolled-back", "committed"):
            await log.copy(tx_id, TxState.PREPARED)  # a crash came before the state file
        await log.copy("resumed", TxState.PARKED)
        await log.op("parked-later", "park")
        await log.op("resumed", "resume")
        await log.op("rolled-back", "rollback")
        await log.commit("committed")
    finally:
        await store.close()
    return log.created_ms


def test_copies_of_a_half_are_one_transaction(spark: Any, tmp_path: Path, service_db: str) -> None:
    data = tmp_path / "broker"
    created_ms = asyncio.run(_write(data))
    out = tmp_path / "out"
    opts = JobOptions(
        services=(ServiceSpec("orders", service_db, "orders"),),
        log=data,
        out=out,
        grace_s=0,
        as_of_ms=int(time.time() * 1000) + 2 * HOUR_MS,
        progress=False,
    )
    summary = reconcile(opts, _Progress(None, False), spark)  # type: ignore[arg-type]
    rows = spark.read.parquet(str(out / "anomalies")).collect()
    # Each once, as of the PREPARE (the originals were stored now, in this test, an hour after
    # the time the copies keep as their born time: the earlier of the two counts).
    assert sorted((r["reason"], r["id"], r["at_ms"]) for r in rows) == [
        ("half message undecided", "resumed", created_ms),
        ("half message undecided", "twice", created_ms),
        ("transaction parked", "parked-later", created_ms),
        ("transaction parked", "parked-op-gone", created_ms),
    ]
    assert summary["anomalies"] == {"lost": 0, "phantom": 0, "duplicate": 0, "stuck": 4}
