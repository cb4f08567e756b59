"""When the job cannot run it exits 2 with one line that names the input at fault and says
what to do: a database without the txbroker tables, a database that is not there, a log
directory that is not one, bad arguments."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from txbroker_reconcile.run import EXIT_CANNOT_RUN, main


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err
    return code, " ".join(err.split())  # rich wraps long lines


def test_a_database_without_the_tables_names_the_migration(
    spark: Any, tmp_path: Path, empty_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "bare.db"
    sqlite3.connect(db).close()
    code, err = _run(
        capsys,
        "--service",
        f"billing=sqlite:///{db}",
        "--log",
        str(empty_log),
        "--out",
        str(tmp_path),
    )
    assert code == EXIT_CANNOT_RUN
    assert "service billing" in err and "txb_local_tx is missing" in err
    assert f"txbroker db upgrade --url sqlite:///{db}" in err


def test_an_unreachable_database_names_the_service(
    spark: Any, tmp_path: Path, empty_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = "postgresql://postgres@127.0.0.1:1/nowhere"
    code, err = _run(
        capsys, "--service", f"orders={url}", "--log", str(empty_log), "--out", str(tmp_path)
    )
    assert code == EXIT_CANNOT_RUN
    assert "service orders: cannot read postgresql://postgres@127.0.0.1:1/nowhere" in err


def test_a_directory_without_segments_is_named(
    spark: Any, tmp_path: Path, service_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(
        capsys,
        "--service",
        f"svc={service_db}",
        "--log",
        str(tmp_path),
        "--out",
        str(tmp_path / "o"),
    )
    assert code == EXIT_CANNOT_RUN and f"no commit-log segments in '{tmp_path}'" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--service", "orders", "--out", "x"], "expected NAME=VALUE"),
        (["--service", "a=sqlite:///a.db", "--out", "x", "--grace", "soon"], "not a duration"),
        (
            ["--service", "a=sqlite:///a.db", "--out", "x", "--every", "30s"],
            "--every needs --state",
        ),
        (["--service", "a=mysql://h/db", "--out", "x"], "'mysql' databases are not supported"),
        (
            ["--service", "a=sqlite:///a.db", "--out", "x", "--effect", "b=t.c"],
            "names no --service: b",
        ),
    ],
)
def test_bad_arguments_say_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    code, err = _run(capsys, *argv)
    assert code == EXIT_CANNOT_RUN and says in err
