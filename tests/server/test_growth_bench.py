"""`txbroker bench growth` at a tiny size: a real broker started on a filled store, its start-up
time and memory read, every point printed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_growth_bench_reports_each_point(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "txbroker.cli", "bench", "growth", "--messages", "3000", "6000"]
    out = subprocess.run(
        [*cmd, "--groups", "50", "--data-dir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    points = [json.loads(line) for line in out.splitlines()]
    assert [(p["messages"], p["groups"]) for p in points] == [
        (0, 0), (3000, 0), (6000, 0), (6000, 50)
    ]  # fmt: skip
    for p in points:
        assert p["start_s"] > 0 and p["rss_mib"] > 0 and p["rss_anon_mib"] > 0
    # The log holds what was written: at least the 1 KiB bodies, not the preallocated files.
    assert 6000 * 1024 < points[2]["log_bytes"] < 6000 * 2048
    assert points[1]["log_bytes"] < points[2]["log_bytes"]
    assert list(tmp_path.iterdir()) == []  # the temporary store is removed
