"""``txbroker bench reconcile``: how long the Spark reconciliation takes on N transactions.

For each size N it builds a world the job cannot tell from production (N rows in a fresh
PostgreSQL database's SDK tables, N matching transactions in a real commit log written by the
store's own append path), injects ``anomalies`` of each kind (lost, phantom, duplicate, stuck),
times the job and checks that it found exactly the injected ids and nothing else. Only
aggregates and the injected examples reach the driver, so its memory does not grow with N.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from txbroker.store import FlushMode, Message, MessageStore, RecordFlag, StoreConfig
from txbroker.tx.state import (
    HALF_TOPIC,
    PROP_GROUP,
    PROP_TARGET_QUEUE,
    PROP_TARGET_TOPIC,
    PROP_TIMEOUT,
    PROP_TX,
)

__all__ = ["ReconcileBenchResult", "bench_reconcile", "format_reconcile"]

TOPIC: Final = "orders"
PRODUCER_GROUP: Final = "orders-svc"
GROUP: Final = "billing"
_CHUNK: Final = 100_000
_BODY: Final = b'{"order": "0000000000", "amount": 100}'.ljust(64)
_EXPECTED: Final = {
    "committed, no message": "lost",
    "no local transaction": "phantom",
    "two messages for one transaction": "duplicate",
    "not processed by the group": "stuck",
}

Say = Callable[[str], None]


@dataclass(frozen=True)
class ReconcileBenchResult:
    rows: int
    messages: int  # visible
    records: int  # in the log: each transaction's half record and committed copy
    load_s: float  # building the world (not part of the figure)
    job_s: float  # the reconciliation, from starting Spark to the summary
    rows_per_s: float  # (local rows + log records + inbox rows) / job_s
    found: dict[str, int]  # reason -> count the job reported
    exact: bool  # every injected id found, nothing else


def _tx(i: int) -> str:
    return f"{i:032x}"


def _mid(i: int) -> str:
    return f"m{i:031x}"


async def _load_tables(url: str, n: int, k: int, say: Say) -> None:
    import asyncpg

    from txbroker_sdk.database import async_url

    dsn = async_url(url).replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    base = datetime.now(UTC) - timedelta(hours=3)
    try:
        # Committed local transactions 0..n-1, plus k lost ones (ids n..n+k-1) with no message.
        def local() -> Iterator[tuple[Any, ...]]:
            for i in range(n + k):
                yield (_tx(i), "committed", TOPIC, None, base + timedelta(microseconds=i * 100))

        # The group processed every message but the last k of 0..n-1 (stuck); the phantoms
        # (message ids n+k..) and the duplicates' second copies (n+2k..) too.
        def inbox() -> Iterator[tuple[Any, ...]]:
            for i in range(n - k):
                yield (GROUP, _mid(i), base + timedelta(microseconds=i * 100 + 50_000))
            for j in range(2 * k):
                yield (GROUP, _mid(n + k + j), base + timedelta(microseconds=j))

        for table, rows, columns, total in (
            ("txb_local_tx", local(), ["tx_id", "state", "topic", "key", "created_at"], n + k),
            ("txb_inbox", inbox(), ["consumer_group", "message_id", "processed_at"], n + k),
        ):
            done = 0
            while chunk := [r for _, r in zip(range(_CHUNK), rows, strict=False)]:
                await conn.copy_records_to_table(table, records=chunk, columns=columns)
                done += len(chunk)
                if done % 1_000_000 < _CHUNK or done == total:
                    say(f"COPY {table}: {done:,}/{total:,}")
        await conn.execute("ANALYZE txb_local_tx; ANALYZE txb_inbox")
    finally:
        await conn.close()


async def _write_log(data_dir: Path, n: int, k: int, say: Say) -> tuple[int, int]:
    """As the broker writes a transactional message: a half record in the half topic, then the
    committed copy in the message's topic (which records the commit), for 0..n-1; then k
    phantoms (ids n+k.., committed, no local row) and k second copies of the first k
    transactions. Returns (visible messages, records)."""
    # The broker's default segment size: the job reads one segment per task, so this is also
    # how the work spreads over the cores.
    store = await MessageStore.open(StoreConfig(data_dir, flush=FlushMode.ASYNC, retention_ms=None))
    committed, half = int(RecordFlag.TX_COMMITTED), int(RecordFlag.TX_HALF)

    def msg(tx: int, mid: int) -> Message:
        return Message(TOPIC, _BODY, mid % 4, {"id": _mid(mid), "tx": _tx(tx)}, committed)

    def prepared(tx: int) -> Message:
        props = {
            "id": _mid(tx),
            PROP_TX: _tx(tx),
            PROP_TARGET_TOPIC: TOPIC,
            PROP_TARGET_QUEUE: str(tx % 4),
            PROP_GROUP: PRODUCER_GROUP,
            PROP_TIMEOUT: "6000",
        }
        return Message(HALF_TOPIC, _BODY, 0, props, half)

    def both(txs: range) -> list[Message]:
        return [m for i in txs for m in (prepared(i), msg(i, i))]

    try:
        for start in range(0, n, 1000):
            end = min(n, start + 1000)
            await store.append_batch(both(range(start, end)))
            if end % 1_000_000 < 1000:
                say(f"log: {end:,}/{n:,} transactions")
        await store.append_batch(both(range(n + k, n + 2 * k)))  # phantoms
        await store.append_batch([msg(j, n + 2 * k + j) for j in range(k)])  # second copies
    finally:
        await store.close()
    return n + 2 * k, 2 * n + 3 * k


def _expected_ids(n: int, k: int) -> dict[str, set[str]]:
    return {
        "committed, no message": {_tx(n + j) for j in range(k)},
        "no local transaction": {_tx(n + k + j) for j in range(k)},
        "two messages for one transaction": {_tx(j) for j in range(k)},
        "not processed by the group": {_mid(n - k + j) for j in range(k)},
    }


async def _build(url: str, data_dir: Path, n: int, k: int, say: Say) -> tuple[int, int]:
    await _load_tables(url, n, k, say)
    return await _write_log(data_dir, n, k, say)


def bench_reconcile(
    server_url: str,
    rows: int,
    *,
    anomalies: int = 25,
    master: str = "local[2]",
    data_root: Path | None = None,
    say: Say = lambda _s: None,
) -> ReconcileBenchResult:
    """Time the job on a world of ``rows`` transactions with ``anomalies`` of each kind injected.

    The world: N committed rows in ``txb_local_tx`` and N rows in ``txb_inbox`` (loaded with
    COPY, not row inserts), and N transactions in the log, each a half record and its committed
    copy, as the broker writes them. The injected kinds::

        lost       local rows with no message
        phantom    messages whose transaction the service never recorded
        duplicate  transactions with a second message (both processed)
        stuck      messages the consumer group never processed

    The job runs on ``local[2]`` by default.
    """
    import asyncio

    from txbroker_reconcile.jars import find_jars
    from txbroker_reconcile.options import JobOptions, ServiceSpec
    from txbroker_reconcile.run import _Progress, reconcile
    from txbroker_reconcile.session import spark_session
    from txbroker_sdk.schema import upgrade
    from txbroker_sdk.testing import create_database, drop_database

    k = anomalies
    work = Path(tempfile.mkdtemp(prefix="txb-rbench-", dir=data_root))
    url = asyncio.run(create_database(server_url, "txb_rbench"))
    try:
        upgrade(url)
        t0 = time.perf_counter()
        messages, records = asyncio.run(_build(url, work / "broker", rows, k, say))
        load_s = time.perf_counter() - t0
        opts = JobOptions(
            services=(ServiceSpec("orders", url, "orders"),),
            log=work / "broker",
            out=work / "out",
            grace_s=60,
            as_of_ms=int(time.time() * 1000) + 3_600_000,
            progress=False,
            examples=k,
            master=master,
        )
        say(f"reconciling {rows:,} rows and {records:,} log records with Spark ({master})")
        t1 = time.perf_counter()
        spark = spark_session(master, find_jars(["postgresql"]))
        try:
            summary = reconcile(opts, _Progress(None, False), spark)  # type: ignore[arg-type]
        finally:
            spark.stop()  # each size pays the session's start, as a run of the job does
        job_s = time.perf_counter() - t1
        found = {r["reason"]: r["count"] for r in summary["by_reason"]}
        listed: dict[str, set[str]] = {}
        for e in summary["examples"]:
            listed.setdefault(e["reason"], set()).add(e["id"])
        exact = set(found) == set(_EXPECTED) and listed == _expected_ids(rows, k)
        exact = exact and all(v == k for v in found.values())
        total = (rows + k) + records + (rows + k)
        return ReconcileBenchResult(
            rows, messages, records, load_s, job_s, total / job_s, found, exact
        )
    finally:
        asyncio.run(drop_database(url))
        shutil.rmtree(work, ignore_errors=True)


def format_reconcile(results: list[ReconcileBenchResult]) -> str:
    lines = [
        f"{'rows':>12} {'log records':>12} {'job s':>8} {'rows/s':>12} {'s per 1M':>9}  found",
    ]
    for r in results:
        per_m = r.job_s / (r.rows / 1e6)
        verdict = "exactly the injected anomalies" if r.exact else f"MISMATCH {r.found}"
        lines.append(
            f"{r.rows:>12,} {r.records:>12,} {r.job_s:>8.1f} {r.rows_per_s:>12,.0f} "
            f"{per_m:>9.1f}  {verdict}"
        )
    return "\n".join(lines)
