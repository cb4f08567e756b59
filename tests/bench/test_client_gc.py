"""The latency benches' clients run under the broker's garbage collector settings."""

from __future__ import annotations

import subprocess
import sys

# In a child: freezing the heap is for the rest of a process's life, not the test runner's.
LOOK = """
import gc
from txbroker.bench.broker_bench import run_client
from txbroker.runtime.gctune import YOUNG_THRESHOLD

async def look():
    return gc.get_threshold()[0], gc.get_freeze_count()

plain = run_client(look())
assert plain[0] != YOUNG_THRESHOLD and plain[1] == 0, plain
tuned = run_client(look(), broker_gc=True)
assert tuned[0] == YOUNG_THRESHOLD and tuned[1] > 0, tuned
"""


def test_a_latency_bench_client_is_frozen_and_collects_young_objects_rarely() -> None:
    done = subprocess.run(
        [sys.executable, "-c", LOOK], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
