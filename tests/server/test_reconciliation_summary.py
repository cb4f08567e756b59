"""The broker reads the newest summary the reconciliation job wrote (for the console, and for
/metrics): the file name and format version it expects are the job's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from txbroker.server.reconciliation import SUMMARY_FILE, SUMMARY_VERSION, latest_summary


def test_the_broker_expects_what_the_job_writes() -> None:
    from txbroker_reconcile import summary

    assert (SUMMARY_FILE, SUMMARY_VERSION) == (summary.SUMMARY_FILE, summary.SUMMARY_VERSION)


def _write(path: Path, doc: object, mtime_s: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    os.utime(path, (mtime_s, mtime_s))


def test_the_newest_summary_of_the_folder_and_its_subfolders_wins(tmp_path: Path) -> None:
    assert latest_summary(tmp_path / "missing") is None
    assert latest_summary(tmp_path) is None
    doc = {"version": 1, "clean": False, "as_of_ms": 5, "anomalies": {"lost": 2, "stuck": 0}}
    _write(tmp_path / SUMMARY_FILE, {**doc, "as_of_ms": 1}, 1_000)
    _write(tmp_path / "2026-11-24" / SUMMARY_FILE, {**doc, "as_of_ms": 2}, 2_000)
    _write(tmp_path / "2026-11-25" / SUMMARY_FILE, doc, 3_000)
    (tmp_path / "2026-11-26").mkdir()  # a run still writing: no summary yet
    found = latest_summary(tmp_path)
    assert found is not None and found.problem is None
    assert found.path == tmp_path / "2026-11-25" / SUMMARY_FILE and found.modified_ms == 3_000_000
    assert (found.clean, found.as_of_ms, found.anomalies) == (False, 5, {"lost": 2, "stuck": 0})


def test_a_summary_that_cannot_be_used_says_why(tmp_path: Path) -> None:
    path = tmp_path / SUMMARY_FILE
    path.write_text("{not json")
    found = latest_summary(tmp_path)
    assert found is not None and found.document == {} and "cannot be read" in str(found.problem)
    path.write_text(json.dumps({"version": 2}))
    found = latest_summary(tmp_path)
    assert found is not None and "format version 2" in str(found.problem)
    assert found.clean is None and found.anomalies == {}
