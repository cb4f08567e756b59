"""`txbroker bench produce --replicas`: latency with and without slaves, slave lag under load."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from txbroker.bench.broker_bench import format_produce
from txbroker.bench.repl_lag import LagSampler


def test_produce_with_a_sync_slave_reports_latency_and_lag(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "produce",
        "--messages",
        "3000",
        "--producers",
        "2",
        "--inflight",
        "16",
        "--replicas",
        "1",
        "--replication",
        "sync",
        "--runs",
        "2",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["replicas"] == 1 and res["replication"] == "sync"
    for med in (res["median"], res["baseline"]["median"]):
        lat = med["ack_latency"]
        assert med["messages"] == 3000 and med["msgs_per_s"] > 0
        assert lat["p99_ms"] >= lat["p50_ms"] > 0
    assert "replication_lag" not in res["baseline"]["median"]
    assert set(res["paired_ratio"]) == {"msgs_per_s", "p50_ms", "p99_ms"}
    assert all(r > 0 for r in res["paired_ratio"].values())
    lag = res["median"]["replication_lag"]
    assert lag["samples"] >= 1 and lag["errors"] == 0
    for unit in ("bytes", "ms"):
        assert 0 <= lag[f"{unit}_p50"] <= lag[f"{unit}_p99"] <= lag[f"{unit}_max"]
    text = format_produce(res)
    assert "with slaves" in text and "slave lag" in text and "behind it in time" in text
    assert len(res["all"]) == len(res["baseline"]["all"]) == 2  # in turn: without, with, ...
    assert list(tmp_path.iterdir()) == []  # master and slave stopped, directories removed


def test_lag_is_read_against_the_master_interpolated() -> None:
    # The master's flushed log grows 1000 B per second from t=10; a slave's readings between.
    s = LagSampler("http://master", ["http://slave"])
    s.master_series = [(10.0, 0), (11.0, 1000), (12.0, 2000)]
    s.slave_series = [[(10.5, 500), (11.5, 1000), (13.0, 2000)]]  # caught up, 500 B, outside
    res = s.summary()
    assert res["samples"] == 2  # the reading after the master's last one has nothing to meet
    # at t=11.5 the master had 1500 B, the slave 1000 B: the master's at t=11, 0.5 s before
    assert (res["bytes_max"], res["ms_max"]) == (500.0, 500.0)
    s.slave_series = [[(10.5, 500)]]
    assert (s.summary()["bytes_max"], s.summary()["ms_max"]) == (0.0, 0.0)
