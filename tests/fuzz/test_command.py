"""`txbroker bench fuzz` as a user runs it: its own broker, both targets, the table."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli


def test_the_command_prints_the_table_and_leaves_nothing_behind(tmp_path: Path) -> None:
    args = ("--cases", "60", "--seconds", "3", "--seed", "5", "--data-dir", str(tmp_path))
    done = run_cli("bench", "fuzz", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
    assert rows["wire"][1] == "60" and rows["http"][1] == "60"  # cases
    assert rows["wire"][3] == "0" and rows["http"][3] == "0"  # crashes
    assert "healthy client: sent" in done.stdout
    assert list(tmp_path.iterdir()) == []  # the broker's folder is gone, no log kept

    done = run_cli("bench", "fuzz", "--target", "wire", "--json", *args)
    assert done.returncode == 0, done.stderr
    (report,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert report["target"] == "wire" and report["cases"] == 60 and report["crashes"] == 0
