"""The command line, run as a user runs it: a real process, real output."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli


def test_bench_store_prints_json_figures(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "store",
        "--messages",
        "2000",
        "--appenders",
        "8",
        "--runs",
        "2",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    med = summary["median"]
    assert summary["runs"] == 2 and med["messages"] == 2000
    assert out.stderr == ""  # --json: no progress either
    assert med["msgs_per_s"] > 0 and med["raw_msgs_per_s"] > 0
    assert med["fsyncs"] > 0 and med["records_per_fsync"] >= 1
    assert 0 < med["append_p50_us"] <= med["append_p99_us"] <= med["append_p999_us"]
    assert list(tmp_path.iterdir()) == []  # the bench cleans up after itself


def test_bench_store_human_output(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "store",
        "--messages",
        "1000",
        "--flush",
        "async",
        "--runs",
        "2",
        "--data-dir",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    assert "msgs/s" in out.stdout and "raw ceiling" in out.stdout
    # Off a terminal, progress is a line per finished run on stderr (a bar on a terminal).
    progress = out.stderr.splitlines()
    assert [line.split(" (")[0] for line in progress] == [
        "store bench: run 1/2 done",
        "store bench: run 2/2 done",
    ]


def test_bench_recovery_small(tmp_path: Path) -> None:
    out = run_cli("bench", "recovery", "--log-mib", "8", "--data-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["log_bytes"] >= 8 * 1024 * 1024
    assert res["replayed_full"] == res["records"] > 7000


def test_bad_arguments_are_refused() -> None:
    out = run_cli("bench", "store", "--size", "-1")
    assert out.returncode == 2 and "must be >= 0" in out.stderr


def test_bench_disk(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "disk",
        "--batch",
        "8",
        "64",
        "--records",
        "2000",
        "--runs",
        "1",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert set(res) == {"8", "64"} and all(v > 0 for v in res.values())


def test_bench_produce_and_e2e_small(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "produce",
        "--messages",
        "400",
        "--producers",
        "2",
        "--batch",
        "8",
        "--runs",
        "1",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    med = json.loads(out.stdout)["median"]
    assert med["messages"] == 400 and med["msgs_per_s"] > 0 and med["ack_latency"]["p50_ms"] > 0
    assert med["broker_cpu_s"] > 0  # the broker's CPU over the run, read from /proc
    out = run_cli(
        "bench",
        "e2e",
        "--rate",
        "200",
        "--seconds",
        "1",
        "--runs",
        "1",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    med = json.loads(out.stdout)["median"]
    assert med["messages"] == 200 and 0 < med["latency"]["p50_ms"] <= med["latency"]["max_ms"]
    assert list(tmp_path.iterdir()) == []  # brokers stopped, directories removed
