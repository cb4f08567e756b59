"""/metrics of a real broker process: OpenTelemetry instruments in Prometheus text, with the
values the traffic of the test produced."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import BrokerProcess
from txbroker_sdk import Client, Consumer

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Samples by name and labels, the OTel scope labels left out."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset((k, v) for k, v in s.labels.items() if not k.startswith("otel_"))
            out[(s.name, labels)] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def scrape(h: httpx.AsyncClient) -> Samples:
    r = await h.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", "--tx-secret", "shop=s3cret").start()
    yield b
    b.stop()


async def test_metrics_count_the_traffic(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c, httpx.AsyncClient(base_url=broker.http) as h:
        await c.create_topic("orders", queues=2)
        for i in range(5):
            await c.send("orders", b"x" * 100, key=f"o{i}")
        pending = await c.prepare(
            "orders",
            b"half",
            producer_group="shop",
            check_url="http://127.0.0.1:9/check",
            timeout_ms=600_000,  # no check is due while the test runs
        )
        committed = await c.prepare(
            "orders",
            b"whole",
            producer_group="shop",
            check_url="http://127.0.0.1:9/check",
            timeout_ms=600_000,
        )
        await committed.commit()
        rolled = await c.prepare(
            "orders",
            b"never",
            producer_group="shop",
            check_url="http://127.0.0.1:9/check",
            timeout_ms=600_000,
        )
        await rolled.rollback()
        async with Consumer(c, "billing", "orders") as consumer:
            got = []
            while len(got) < 6:  # bounded by fetch's timeout: an empty fetch ends the test
                batch = await consumer.fetch(timeout_ms=2000)
                assert batch, f"only {len(got)} of 6 messages delivered"
                got.extend(batch)
            for m in got[:4]:
                m.ack()
            await consumer.commit()
            m = await scrape(h)
        assert pending.tx_id

    sent = {"messaging_system": "txbroker", "messaging_destination_name": "orders"}
    assert value(m, "messaging_client_sent_messages_total", **sent) == 6  # 5 + the committed
    group = {**sent, "messaging_consumer_group_name": "billing"}
    consumed = value(m, "messaging_client_consumed_messages_total", **group)
    lags = [
        value(
            m,
            "txbroker_consumer_lag",
            messaging_destination_name="orders",
            messaging_consumer_group_name="billing",
            messaging_destination_partition_id=str(q),
        )
        for q in (0, 1)
    ]
    # Acks commit each queue's contiguous prefix: consumed and lag always add up to the total.
    assert 1 <= consumed <= 4 and consumed + sum(lags) == 6
    assert value(m, "txbroker_tx_pending") == 1
    assert value(m, "txbroker_tx_parked") == 0
    assert value(m, "txbroker_tx_prepared_total") == 3
    assert value(m, "txbroker_tx_ended_total", txbroker_tx_decision="commit") == 1
    assert value(m, "txbroker_tx_ended_total", txbroker_tx_decision="rollback") == 1
    assert value(m, "txbroker_store_size_bytes") >= 7 * 100
    assert value(m, "txbroker_store_flushed_bytes") == value(m, "txbroker_store_size_bytes")
    fsyncs = value(m, "txbroker_store_fsyncs_total")
    assert fsyncs >= 1
    assert value(m, "txbroker_store_fsync_duration_seconds_count") == fsyncs
    assert value(m, "txbroker_store_fsync_duration_seconds_sum") > 0
    assert value(m, "txbroker_server_connections") == 1


async def test_check_outcomes_and_latency(tmp_path: Path) -> None:
    # Checks due at once, against a port nobody listens on: each is "unreachable" (a check that
    # was never sent does not count towards parking, so the transaction stays pending).
    b = BrokerProcess(
        tmp_path / "broker",
        "--tx-secret",
        "shop=s3cret",
        "--check-backoff-base-ms",
        "50",
        "--check-backoff-cap-ms",
        "50",
    ).start()
    try:
        async with await Client.connect(b.url) as c, httpx.AsyncClient(base_url=b.http) as h:
            await c.create_topic("orders", queues=1)
            await c.prepare(
                "orders",
                b"half",
                producer_group="shop",
                check_url="http://127.0.0.1:9/check",
                timeout_ms=50,
            )
            deadline = time.monotonic() + 30
            while (checks := _unreachable(m := await scrape(h))) < 2:
                assert time.monotonic() < deadline, f"{checks} checks in 30 s"
                await asyncio.sleep(0.1)  # polling the broker's state: the condition under test
    finally:
        b.stop()
    outcome = {"txbroker_check_outcome": "unreachable"}
    # One scrape: the counter and the histogram are told of each check at the same moment.
    assert value(m, "txbroker_tx_check_duration_seconds_count", **outcome) == checks
    assert 0 < value(m, "txbroker_tx_check_duration_seconds_sum", **outcome) < 30 * checks
    assert value(m, "txbroker_tx_pending") == 1 and value(m, "txbroker_tx_parked") == 0


def _unreachable(m: Samples) -> float:
    return m.get(
        ("txbroker_tx_checks_total", frozenset({("txbroker_check_outcome", "unreachable")})), 0
    )


async def test_latest_reconciliation_summary(tmp_path: Path) -> None:
    # The job's own writer and the keys analyze() fills: the broker reads what a run leaves.
    from txbroker_reconcile.summary import SUMMARY_VERSION, write_summary

    reports = tmp_path / "reports"
    b = BrokerProcess(tmp_path / "broker", "--reconcile-reports", str(reports)).start()
    try:
        async with httpx.AsyncClient(base_url=b.http) as h:
            m = await scrape(h)
            assert not [k for k in m if k[0].startswith("txbroker_reconcile")], "no run yet"
            day = reports / "2026-11-25"
            day.mkdir(parents=True)
            as_of_ms = 1_795_000_000_000
            summary = {
                "version": SUMMARY_VERSION,
                "as_of_ms": as_of_ms,
                "clean": False,
                "anomalies": {"lost_message": 2, "duplicate_apply": 0},
            }
            write_summary(summary, day)
            deadline = time.monotonic() + 10
            while ("txbroker_reconcile_clean", frozenset()) not in (m := await scrape(h)):
                assert time.monotonic() < deadline, "the summary never showed on /metrics"
                await asyncio.sleep(0.2)  # the broker re-reads the folder at most once a second
    finally:
        b.stop()
    assert value(m, "txbroker_reconcile_clean") == 0
    assert value(m, "txbroker_reconcile_as_of_seconds") == as_of_ms / 1000
    by_reason = {
        reason: value(m, "txbroker_reconcile_anomalies", txbroker_reconcile_reason=reason)
        for reason in ("lost_message", "duplicate_apply")
    }
    assert by_reason == {"lost_message": 2, "duplicate_apply": 0}
