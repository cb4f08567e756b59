"""What a real Spark gets from the services' tables through JDBC: every time as exact epoch
milliseconds, from SQLite (the xerial driver) as from PostgreSQL; an incremental read that
starts within a second; whole-second rows counted; and the latency table's percentiles hidden
below their minimum sample counts."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from tests.reconcile.conftest import run_async, scratch_pg
from txbroker_reconcile.latency import MIN_SAMPLES, latencies
from txbroker_reconcile.options import ServiceSpec
from txbroker_reconcile.sources import ServiceDb
from txbroker_sdk.database import async_url
from txbroker_sdk.schema import upgrade
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX

# Two times within one second, and one more: their milliseconds (rounded from microseconds).
A = datetime(2026, 11, 27, 18, 58, 37, 123_456, tzinfo=UTC)
B = datetime(2026, 11, 27, 18, 58, 37, 876_543, tzinfo=UTC)
C = datetime(2026, 11, 27, 19, 0, 1, 5_000, tzinfo=UTC)


def _ms(t: datetime) -> int:
    return round(t.timestamp() * 1000)


async def _fill(url: str) -> None:
    engine = create_async_engine(async_url(url))
    async with engine.begin() as conn:
        for tx_id, at in (("a", A), ("b", B), ("c", C)):
            await conn.execute(
                LOCAL_TX.insert().values(tx_id=tx_id, state="committed", created_at=at)
            )
            await conn.execute(
                INBOX.insert().values(consumer_group="g", message_id=tx_id, processed_at=at)
            )
        await conn.execute(
            OUTBOX.insert().values(topic="t", body=b"x", created_at=A, published_at=B)
        )
        await conn.execute(OUTBOX.insert().values(topic="t", body=b"y", created_at=C))
    await engine.dispose()


def _check_reads(spark: Any, url: str) -> ServiceDb:
    db = ServiceDb(spark, ServiceSpec("svc", url, "svc"))
    local = {r["tx_id"]: r["created_ms"] for r in db.local_tx(None).collect()}
    assert {k: local[k] for k in "abc"} == {"a": _ms(A), "b": _ms(B), "c": _ms(C)}
    inbox = {r["message_id"]: r["processed_ms"] for r in db.inbox(None).collect()}
    assert {k: inbox[k] for k in "abc"} == {"a": _ms(A), "b": _ms(B), "c": _ms(C)}
    outbox = sorted((r["created_ms"], r["published_ms"]) for r in db.outbox(None).collect())
    assert outbox == [(_ms(A), _ms(B)), (_ms(C), None)]
    assert dict(db.local_tx(None).dtypes)["created_ms"] == "bigint"
    # An incremental read from a mark between A and B, in the same second: B and C only.
    since = {r["tx_id"] for r in db.local_tx(_ms(A) + 1).collect()}
    assert since >= {"b", "c"} and "a" not in since
    assert {r["message_id"] for r in db.inbox(_ms(B) + 1).collect()} == {"c"}
    return db


def test_sqlite_times_arrive_as_exact_milliseconds(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "svc.db"
    url = f"sqlite:///{path}"
    upgrade(url)
    run_async(_fill(url))
    # One more row by the table's own default (the SDK's write), and two as a table made by
    # the first revision held them: whole seconds.
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO txb_local_tx (tx_id, state) VALUES ('d', 'committed')")
        (d_text,) = conn.execute("SELECT created_at FROM txb_local_tx WHERE tx_id = 'd'").fetchone()
        conn.execute(
            "INSERT INTO txb_local_tx (tx_id, state, created_at) "
            "VALUES ('old', 'committed', '2026-11-27 18:00:00')"
        )
        conn.execute(
            "INSERT INTO txb_inbox (consumer_group, message_id, processed_at) "
            "VALUES ('g', 'old', '2026-11-27 18:00:01')"
        )
    db = _check_reads(spark, url)
    local = {r["tx_id"]: r["created_ms"] for r in db.local_tx(None).collect()}
    d = datetime.fromisoformat(d_text).replace(tzinfo=UTC)
    assert local["d"] == _ms(d) and local["old"] == _ms(datetime(2026, 11, 27, 18, tzinfo=UTC))
    assert db.whole_second_rows() == 2


def test_postgresql_times_arrive_as_exact_milliseconds(spark: Any) -> None:
    with scratch_pg("txb_times") as url:
        run_async(_fill(url))
        db = _check_reads(spark, url)
        assert db.whole_second_rows() == 0


def test_percentiles_are_null_below_their_minimum_sample_count(spark: Any) -> None:
    counts = {"three": 3, "nineteen": 19, "twenty": 20, "ninety-nine": 99, "a hundred": 100}
    rows = [
        (topic, "commit → store", None, ms) for topic, n in counts.items() for ms in range(1, n + 1)
    ]
    legs = spark.createDataFrame(rows, "topic string, leg string, group string, ms long")
    got = {r["topic"]: r.asDict() for r in latencies(legs).collect()}
    assert {t: got[t]["count"] for t in counts} == counts
    assert all(got[t]["p50"] is not None and got[t]["max"] == n for t, n in counts.items())
    assert [t for t in counts if got[t]["p95"] is not None] == [
        "twenty",
        "ninety-nine",
        "a hundred",
    ]
    assert [t for t in counts if got[t]["p99"] is not None] == ["a hundred"]
    # At the minimum a percentile is a sample below the max: the threshold's reason.
    assert got["twenty"]["p95"] == 19 and got["a hundred"]["p99"] == 99
    assert MIN_SAMPLES == {"p50": 1, "p95": 20, "p99": 100}
