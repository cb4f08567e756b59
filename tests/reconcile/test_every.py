"""`--every`: the job keeps reconciling into its state and rewrites the summary each pass,
until SIGTERM, then exits with the last verdict."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.conftest import ROOT


def test_every_keeps_reconciling_until_sigterm(
    spark_jars: list[str], tmp_path: Path, empty_log: Path, service_db: str
) -> None:
    out, state = tmp_path / "out", tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "txbroker.cli", "reconcile", "--service", f"svc={service_db}",
            "--log", str(empty_log), "--out", str(out), "--state", str(state),
            "--every", "1s", "--json", "--master", "local[1]",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
        env={**os.environ, "TXBROKER_SPARK_MEMORY": "1g"},
    )  # fmt: skip
    passes: list[dict[str, Any]] = []
    try:
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        # Two passes take about a minute alone (a Spark start, then two jobs); a loaded 2-core
        # machine running the suite beside other work once took over 180 s.
        deadline = time.monotonic() + 300
        while len(passes) < 2:
            left = deadline - time.monotonic()
            assert left > 0, f"only {len(passes)} passes in 300 s"
            if sel.select(timeout=left):
                line = proc.stdout.readline()
                assert line, f"the job ended early with {proc.wait()}"
                passes.append(json.loads(line))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0  # the last pass was clean
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [p["inputs"]["run"] for p in passes] == [1, 2]
    assert json.loads((state / "watermark.json").read_text())["run"] >= 2
    assert json.loads((out / "summary.json").read_text())["clean"]
