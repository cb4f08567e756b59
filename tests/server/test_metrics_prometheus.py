"""A real Prometheus (the Debian package) scrapes a real broker every second; its HTTP API
answers the rate, the pending half messages and the lag the broker's traffic made."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import BrokerProcess, free_port
from txbroker_sdk import Client, Consumer

WAIT_S = 30.0  # each condition Prometheus has to see: scrapes are 1 s apart


class Prometheus:
    def __init__(self, tmp: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            if os.environ.get("CI") == "true":
                pytest.fail("prometheus is missing: make installs the Debian package")
            pytest.skip("prometheus is not installed (Debian package prometheus)")
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n  - job_name: txbroker\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        self.url = f"http://127.0.0.1:{free_port()}"
        self._log = (tmp / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert self._proc.poll() is None, "prometheus exited; see prometheus.log"
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready"
            time.sleep(0.1)  # polling a process coming up

    def query(self, expr: str) -> float | None:
        r = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=5)
        body = r.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    async def wait_for(self, expr: str, expected: float) -> None:
        deadline = time.monotonic() + WAIT_S
        while (seen := self.query(expr)) != expected:
            assert time.monotonic() < deadline, f"{expr} is {seen}, not {expected}"
            await asyncio.sleep(0.2)  # polling Prometheus until a scrape brought the value

    def stop(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._log.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", "--tx-secret", "shop=s3cret").start()
    yield b
    b.stop()


@pytest.fixture
def prometheus(tmp_path: Path, broker: BrokerProcess) -> Iterator[Prometheus]:
    p = Prometheus(tmp_path, broker.http.removeprefix("http://"))
    try:
        p.wait_ready()
        yield p
    finally:
        p.stop()


SENT = 'sum(messaging_client_sent_messages_total{messaging_destination_name="orders"})'
RATE = 'sum(rate(messaging_client_sent_messages_total{messaging_destination_name="orders"}[1m]))'
LAG = 'sum(txbroker_consumer_lag{messaging_consumer_group_name="billing"})'
CONSUMED = 'sum(messaging_client_consumed_messages_total{messaging_consumer_group_name="billing"})'


async def test_prometheus_sees_rates_pending_halves_and_lag(
    broker: BrokerProcess, prometheus: Prometheus
) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("orders", queues=2)
        for i in range(10):
            await c.send("orders", b"x", key=f"a{i}")
        await prometheus.wait_for(SENT, 10)
        # A second scrape with more messages: two samples, so the rate is defined and positive.
        for i in range(20):
            await c.send("orders", b"x", key=f"b{i}")
        await prometheus.wait_for(SENT, 30)
        rate = prometheus.query(RATE)
        assert rate is not None and rate > 0

        halves = [
            await c.prepare(
                "orders",
                b"half",
                producer_group="shop",
                check_url="http://127.0.0.1:9/check",
                timeout_ms=600_000,  # no check is due while the test runs
            )
            for _ in range(2)
        ]
        await prometheus.wait_for("txbroker_tx_pending", 2)
        await halves[0].commit()
        await prometheus.wait_for("txbroker_tx_pending", 1)
        await prometheus.wait_for('txbroker_tx_ended_total{txbroker_tx_decision="commit"}', 1)

        async with Consumer(c, "billing", "orders") as consumer:
            got = []
            while len(got) < 31:
                batch = await consumer.fetch(timeout_ms=2000)
                assert batch, f"only {len(got)} of 31 messages delivered"
                got.extend(batch)
            for m in got:
                m.ack()
            await consumer.commit()
            await prometheus.wait_for(LAG, 0)
            await prometheus.wait_for(CONSUMED, 31)
        await c.send("orders", b"late", key="late")
        await prometheus.wait_for(LAG, 1)
