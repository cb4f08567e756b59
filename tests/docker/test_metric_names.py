"""Every metric the Grafana dashboard and the alert rules query is one a real broker exports:
the names are read from its /metrics after traffic that makes every series appear."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx

from tests.conftest import BrokerProcess
from txbroker_sdk import Client, Consumer

DOCKER = Path(__file__).resolve().parents[2] / "docker"
NAME = re.compile(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b")
# Parts of PromQL that hold label names or values, not metric names.
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)|\[[^\]]*\]|\"[^\"]*\"")
PROMQL = {
    "sum", "rate", "histogram_quantile", "max", "min", "avg", "count", "increase",
    "irate", "by", "without", "and", "or", "unless", "le", "time",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    bare = LABELS.sub(" ", expr)
    return {n for n in NAME.findall(bare) if n not in PROMQL and not n[0].isdigit()}


def referenced() -> set[str]:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "txbroker.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    # alerts.yml is flat YAML: one `expr:` per rule, on one line.
    rules = (DOCKER / "prometheus" / "alerts.yml").read_text().splitlines()
    exprs += [line.split("expr:", 1)[1] for line in rules if line.strip().startswith("expr:")]
    return set().union(*(metric_names(e) for e in exprs))


def exported(text: str) -> set[str]:
    return {
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_names_are_parsed_out_of_promql() -> None:
    expr = 'sum by (a_b) (rate(x_total{o=~"t|u"}[5m])) > 0 and y_bytes'
    assert metric_names(expr) == {"x_total", "y_bytes"}


async def test_dashboard_and_rules_query_exported_metrics(tmp_path: Path) -> None:
    wanted = referenced()
    assert len(wanted) >= 8, wanted
    # A run's summary where the broker looks for one: the reconciliation's series exist then.
    from txbroker_reconcile.summary import SUMMARY_VERSION, write_summary

    reports = tmp_path / "reports"
    reports.mkdir()
    summary = {"version": SUMMARY_VERSION, "as_of_ms": 1, "clean": True, "anomalies": {"x": 0}}
    write_summary(summary, reports)
    b = BrokerProcess(
        tmp_path / "broker",
        "--reconcile-reports",
        str(reports),
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
            await c.send("orders", b"plain")
            committed = await c.prepare(
                "orders",
                b"whole",
                producer_group="shop",
                check_url="http://127.0.0.1:9/check",
                timeout_ms=600_000,
            )
            await committed.commit()
            async with Consumer(c, "billing", "orders") as consumer:
                batch = await consumer.fetch(timeout_ms=2000)
                assert batch, "nothing delivered"
                batch[0].ack()
                await consumer.commit()
            # A check due at once against a closed port: the check counter and histogram.
            await c.prepare(
                "orders",
                b"half",
                producer_group="shop",
                check_url="http://127.0.0.1:9/check",
                timeout_ms=50,
            )
            deadline = time.monotonic() + 30
            while missing := wanted - exported((await h.get("/metrics")).text):
                assert time.monotonic() < deadline, f"not exported: {sorted(missing)}"
                await asyncio.sleep(0.1)  # polling the broker's state: the condition under test
    finally:
        b.stop()
