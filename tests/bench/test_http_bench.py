"""`txbroker bench http`: the HTTP API's three workloads beside the TCP protocol's, one run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from txbroker.bench.http_bench import TARGETS, WORKLOADS, format_http


def test_prints_each_workload_over_http_beside_tcp(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "http",
        "--messages",
        "640",
        "--concurrency",
        "8",
        "--batch",
        "8",
        "--batch-concurrency",
        "2",
        "--runs",
        "2",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["runs"] == len(res["all"]) == 2
    for workload in WORKLOADS:
        row = res["median"][workload]
        for transport in ("http", "tcp"):
            f = row[transport]
            assert f["messages"] == 640 and f["msgs_per_s"] > 0, (workload, transport, f)
            assert 0 < f["latency"]["p50_ms"] <= f["latency"]["p99_ms"], (workload, transport)
            assert f["broker_cpu_us"] >= 0
        assert row["ratio"] > 0 and row["target"] == TARGETS[workload]
    ceiling = res["client_ceiling"]
    assert ceiling["requests_per_s"] > 0 and ceiling["client_cpu_us"] > 0
    text = format_http(res)
    for title in ("single, 8 in flight", "batches of 8, 2 in flight", "receive+ack, 8 a receive"):
        assert title in text
    assert "client ceiling" in text and text.count("HTTP/TCP") == 1
    assert list(tmp_path.iterdir()) == []  # the brokers stopped, their directories removed
