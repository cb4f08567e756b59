"""The job under spark-submit, as docs/reconciliation.md documents it: spark-submit owns the
master and the jars, the job its arguments and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from txbroker_reconcile.jars import find_jars


def test_spark_submit_runs_the_job(
    spark_jars: list[str], tmp_path: Path, empty_log: Path, service_db: str
) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    res = subprocess.run(
        [
            str(submit), "--master", "local[1]", "--driver-memory", "1g",
            "--jars", ",".join(find_jars(["sqlite"])),
            str(ROOT / "spark_reconcile" / "job.py"),
            "--service", f"svc={service_db}", "--log", str(empty_log),
            "--out", str(tmp_path / "out"), "--json",
        ],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["clean"] and summary["inputs"]["services"] == {
        "svc": {"local_tx": 0, "outbox": 0, "inbox": 0}
    }
