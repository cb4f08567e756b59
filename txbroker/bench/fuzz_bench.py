"""`txbroker bench fuzz`: the wire and HTTP fuzz runs against one broker process of their own.

The broker runs with an admin token (so token checks are fuzzed too) and small files, in a
temporary directory removed after. The targets run one after the other, each with the whole
case and time budget; each reports its own figures (``fuzz_report.py``).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from txbroker.bench.fuzz_http import fuzz_http
from txbroker.bench.fuzz_report import FuzzReport, fuzz_broker
from txbroker.bench.fuzz_wire import fuzz_wire

__all__ = ["TARGETS", "bench_fuzz", "kept_log"]

TARGETS: Final = ("wire", "http")
# The token of the bench's own broker: it only ever listens on loopback, for this run.
TOKEN: Final = "fuzz-admin-token"


def kept_log(seed: int, data_root: Path | None = None) -> Path:
    """Where a run that saw a crash or a traceback keeps the broker's log (the broker's own
    folder is removed after the run)."""
    return Path(data_root or tempfile.gettempdir()) / f"txb-fuzz-{seed}.log"


def bench_fuzz(
    targets: Sequence[str],
    cases: int,
    seconds: float,
    seed: int,
    concurrency: int,
    data_root: Path | None = None,
) -> list[FuzzReport]:
    reports = []
    with fuzz_broker(TOKEN, data_root) as broker:
        assert broker.proc is not None  # started
        pid = broker.proc.pid
        for target in targets:
            fuzz, address = (
                (fuzz_wire, broker.url) if target == "wire" else (fuzz_http, broker.http)
            )
            run = fuzz(
                address,
                pid,
                TOKEN,
                cases=cases,
                seconds=seconds,
                seed=seed,
                concurrency=concurrency,
                log_path=broker.log_path,
            )
            reports.append(asyncio.run(run))
        if any(r.crashes or r.tracebacks for r in reports):
            shutil.copy(broker.log_path, kept_log(seed, data_root))
    return reports
