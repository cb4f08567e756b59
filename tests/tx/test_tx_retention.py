"""Retention that respects transactions, against real broker processes and a real check-back
server: a parked or open transaction whose half message's segment retention deletes is still
resolvable, by hand or by a back-check, and its message delivered once; the transaction
counters survive restarts."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx

from tests.conftest import BrokerProcess
from tests.tx.conftest import GROUP, CheckServer, tx_broker
from txbroker_checkback import CheckStatus
from txbroker_sdk import Client, Consumer

SEGMENT = 5 * 1024 * 1024  # the smallest segment that holds the largest message
# Quick checks that park after three; retention by size at one segment, looked at every second.
RETAIN = """
tx_timeout_ms = 300
check_backoff_base_ms = 100
check_backoff_cap_ms = 200
max_checks = 3
check_timeout_ms = 500
retention_ms = 0
"""
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def retaining_broker(path: Path, settings: str = RETAIN) -> BrokerProcess:
    return tx_broker(
        path,
        "--segment-mib",
        "5",
        "--retention-bytes",
        str(SEGMENT),
        "--retention-check-interval-ms",
        "1000",
        settings=settings,
    )


def first_segment(data: Path) -> Path:
    return data / "store" / "commitlog" / f"{0:020d}"


async def fill_past_one_segment(c: Client, data: Path) -> None:
    """Send 6 MiB to another topic, then wait (bounded) until retention deleted the first
    segment: everything written before the filler is in it."""
    await c.create_topic("filler", queues=1)
    for _ in range(60):
        await c.send("filler", b"f" * 100 * 1024)
    deadline = time.monotonic() + 30
    while first_segment(data).exists():
        assert time.monotonic() < deadline, "retention did not delete the first segment"
        await asyncio.sleep(0.1)  # retention runs on its own interval: the condition awaited


async def wait_state(c: Client, tx_id: str, state: str, timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while (info := await c.show_transaction(tx_id)).state != state:
        assert time.monotonic() < deadline, f"{tx_id} stayed {info.state}: {info.last_reason}"
        await asyncio.sleep(0.05)  # polling the broker's state: the condition under test


async def consume_all(c: Client, topic: str, group: str) -> list[tuple[bytes, str | None]]:
    out: list[tuple[bytes, str | None]] = []
    async with Consumer(c, group, topic) as consumer:
        while batch := await consumer.fetch(timeout_ms=700):
            for m in batch:
                out.append((m.body, m.msg.key))
                m.ack()
    return out


async def test_a_parked_transaction_outlives_retention_and_commits_by_hand(
    tmp_path: Path, checks: CheckServer
) -> None:
    data = tmp_path / "b"
    b = retaining_broker(data).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            tx = await c.prepare(
                "orders",
                b"parked order",
                producer_group=GROUP,
                check_url=checks.url,
                key="o-1",
                traceparent=TRACEPARENT,
            )
            await wait_state(c, tx.tx_id, "parked")
            parked = await c.show_transaction(tx.tx_id)
            # Its half and its park op record are in the first segment, which goes now.
            await fill_past_one_segment(c, data)
            again = await c.show_transaction(tx.tx_id)
            assert (again.state, again.last_reason, again.checks) == (
                "parked",
                parked.last_reason,
                3,
            )
        b.kill()  # the copy and the state file were made durable before the deletion
        b = retaining_broker(data).start()
        async with await Client.connect(b.url) as c:
            restarted = await c.show_transaction(tx.tx_id)
            assert (restarted.state, restarted.last_reason) == ("parked", parked.last_reason)
            assert restarted.created_ms == parked.created_ms
            assert checks.checks_for(tx.tx_id) == 3  # parked: never checked again
            done = await c.resolve_transaction(tx.tx_id, "commit")
            assert (done.state, done.resolved_by) == ("committed", "operator")
            assert await consume_all(c, "orders", "billing") == [(b"parked order", "o-1")]
        assert b.stop() == 0
        b = retaining_broker(data).start()
        async with await Client.connect(b.url) as c:
            assert (await c.list_transactions()).total == 0
            assert (await c.end_transaction(tx.tx_id, "commit")).duplicate
            assert await consume_all(c, "orders", "audit") == [(b"parked order", "o-1")]
    finally:
        b.stop()


async def test_an_open_transaction_outlives_retention_and_is_checked(
    tmp_path: Path, checks: CheckServer
) -> None:
    data = tmp_path / "b"
    never_parks = RETAIN.replace("max_checks = 3", "max_checks = 100000")
    b = retaining_broker(data, never_parks).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            tx = await c.prepare(
                "orders",
                b"open order",
                producer_group=GROUP,
                check_url=checks.url,
                key="o-2",
                traceparent=TRACEPARENT,
            )
            await fill_past_one_segment(c, data)
        # A restart: nothing of the transaction is left in memory (its body was cached), only
        # what the log and the state file hold.
        b.kill()
        b = retaining_broker(data, never_parks).start()
        asked = checks.checks_for(tx.tx_id)
        deadline = time.monotonic() + 15
        while checks.checks_for(tx.tx_id) < asked + 2:  # still checked, from its copy
            assert time.monotonic() < deadline, "no back-check after retention and a restart"
            await asyncio.sleep(0.05)  # the checker's schedule: the condition awaited
        checks.answers[tx.tx_id] = CheckStatus.COMMIT
        async with await Client.connect(b.url) as c:
            await wait_state(c, tx.tx_id, "committed")
            assert await consume_all(c, "orders", "billing") == [(b"open order", "o-2")]
        mine = [
            (r, tp)
            for r, tp in zip(checks.seen, checks.traceparents, strict=True)
            if r.tx_id == tx.tx_id
        ]
        # Every check, before and after the copy, named the same message and trace.
        assert {(r.topic, r.key, r.message_id, r.producer_group) for r, _ in mine} == {
            ("orders", "o-2", tx.message_id, GROUP)
        }
        assert {tp for _, tp in mine} == {TRACEPARENT}
        b.kill()
        b = retaining_broker(data, never_parks).start()
        async with await Client.connect(b.url) as c:
            assert (await c.list_transactions()).total == 0
            assert await consume_all(c, "orders", "audit") == [(b"open order", "o-2")]
    finally:
        b.stop()


def _counters(metrics: str) -> tuple[float, float, float]:
    def one(pattern: str) -> float:
        found = re.search(pattern + r"[^\n]*\} ([0-9.e+]+)$", metrics, re.M)
        assert found, pattern
        return float(found.group(1))

    return (
        one(r"^txbroker_tx_prepared_total\{"),
        one(r'^txbroker_tx_ended_total\{[^\n]*txbroker_tx_decision="commit"'),
        one(r'^txbroker_tx_ended_total\{[^\n]*txbroker_tx_decision="rollback"'),
    )


async def test_the_transaction_counters_survive_restarts(
    tmp_path: Path, checks: CheckServer
) -> None:
    data = tmp_path / "b"
    b = tx_broker(data).start()
    try:
        async with await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=1)
            for decision in ("commit", "commit", "rollback"):
                tx = await c.prepare(
                    "orders", b"x", producer_group=GROUP, check_url=checks.url, timeout_ms=60_000
                )
                await c.end_transaction(tx.tx_id, decision)
        assert b.stop() == 0
        b = tx_broker(data).start()
        async with httpx.AsyncClient(base_url=b.http) as h:
            assert _counters((await h.get("/metrics")).text) == (3, 2, 1)
        async with await Client.connect(b.url) as c:
            tx = await c.prepare(
                "orders", b"y", producer_group=GROUP, check_url=checks.url, timeout_ms=60_000
            )
            await tx.commit()
        state = data / "meta" / "tx.json"
        deadline = time.monotonic() + 10
        while '"committed":3' not in state.read_text():
            assert time.monotonic() < deadline, state.read_text()
            await asyncio.sleep(0.05)  # the state file is written once a second
        b.kill()
        b = tx_broker(data).start()
        async with httpx.AsyncClient(base_url=b.http) as h:
            assert _counters((await h.get("/metrics")).text) == (4, 3, 1)
    finally:
        b.stop()
