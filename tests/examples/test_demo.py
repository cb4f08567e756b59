"""The demo end to end (real broker, real service processes, real crashes), its report's
arithmetic, and the quickstart example, run against a real broker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from examples.driver import Outcome
from examples.report import Snapshot, anomalies
from tests.conftest import BrokerProcess, spark_children

ROOT = Path(__file__).resolve().parents[2]
# A hang guard, not a speed target: twice what a run took on a machine at load 8-15. Most of it
# is the Spark reconciliation's fixed cost (a JVM, a local job's stages), which a smaller demo
# does not cut (placing and settling the orders was a tenth of it).
DEMO_TIMEOUT_S = 540


def _demo(*args: str) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "examples.demo", *args],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


def _row(out: str, label: str) -> int:
    m = re.search(rf"\| {re.escape(label)}\s+\|\s+([\d,]+) \|", out)
    assert m, f"no {label!r} row in:\n{out}"
    return int(m.group(1).replace(",", ""))


@spark_children  # the demo ends with the Spark reconciliation, in a child process
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_on_sqlite_holds_under_crashes(tmp_path: Path) -> None:
    out = _demo("--orders", "150", "--kills", "1", "--work-dir", str(tmp_path / "demo"))
    assert _row(out, "anomalies") == 0
    placed = _row(out, "orders placed (client got 201/409)")
    assert placed > 100
    assert _row(out, "payments applied") == placed
    assert _row(out, "reservations applied") == placed
    # The Spark reconciliation agrees: its summary ends the demo.
    assert "clean: every committed transaction has exactly one message" in " ".join(out.split())
    # The crashes really happened (the orders service dies only after its DB commit).
    assert _row(out, "billing killed by an injected crash") == 1
    assert _row(out, "relay killed by an injected crash") == 1
    # The Spark report's latencies are milliseconds, not the whole seconds SQLite's
    # CURRENT_TIMESTAMP gave (four figures all multiples of 1,000 by chance: one in 10^12).
    summary = json.loads((tmp_path / "demo" / "reconcile" / "summary.json").read_text())
    e2e = [r for r in summary["latency"] if r["leg"] == "commit → processed"]
    assert e2e and any(r[k] % 1000 for r in e2e for k in ("p50", "max"))
    assert summary["inputs"]["whole_second_rows"] == {"orders": 0, "billing": 0, "inventory": 0}


@spark_children
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_demo_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    out = _demo(
        "--orders", "120", "--kills", "1", "--database-url", pg_url, "--work-dir", str(tmp_path)
    )
    assert _row(out, "anomalies") == 0
    assert _row(out, "payments applied") == _row(out, "orders placed (client got 201/409)")
    assert "clean: every committed transaction has exactly one message" in " ".join(out.split())


def test_report_counts_every_kind_of_anomaly() -> None:
    snap = Snapshot(
        orders={"a", "b", "c"},
        committed={"a", "b"},  # c's only barrier row says rolled_back
        payments=Counter({"a": 2, "x": 1}),
        reservations=Counter({"a": 1, "b": 1, "c": 1}),
        unpublished=1,
        metrics={"txbroker_tx_pending": 1},
    )
    driven = Outcome(placed={"a", "b", "c", "lost"}, declined={"b"})
    found = dict(anomalies(snap, driven))
    assert found == {
        "placed orders missing from the database": 1,  # lost
        "declined orders found in the database": 1,  # b
        "orders without a committed barrier row": 1,  # c
        "committed barrier rows without an order": 0,
        "orders without a payment": 2,  # b, c
        "orders paid more than once": 1,  # a
        "payments for unknown orders": 1,  # x
        "orders without a reservation": 0,
        "orders reserved more than once": 0,
        "reservations for unknown orders": 0,
        "transactions still open at the broker": 1,
        "outbox rows never published": 1,
    }
    assert not snap.settled()


def test_the_quickstart_runs(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "b", "--tx-secret", "shop=s3cret").start()
    try:
        res = subprocess.run(
            [sys.executable, "-m", "examples.quickstart"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            env={
                **os.environ,
                "TXB_SERVER": broker.url,
                "PYTHONPATH": str(ROOT),
            },
        )
    finally:
        broker.stop()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "placed 3 orders" in res.stdout
    assert re.search(r"paid and emailed: order-\w+, order-\w+, order-\w+", res.stdout)
