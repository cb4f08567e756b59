"""How the CLI prints: relative and local times, and tables that line up off a terminal."""

from __future__ import annotations

from datetime import datetime

import pytest

from txbroker.cli.output import Column, human_time, print_fields, print_table
from txbroker.runtime.timetext import ago

NOW = 1_750_000_000_000


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (NOW, "now"),
        (NOW - 12_000, "12 s ago"),
        (NOW - 3 * 60_000, "3 min ago"),
        (NOW - 90 * 60_000, "1.5 h ago"),
        (NOW - 3 * 86_400_000, "3.0 days ago"),
        (NOW + 5_000, "in 5 s"),
        (NOW + 10 * 60_000, "in 10 min"),
    ],
)
def test_ago(ms: int, text: str) -> None:
    assert ago(ms, NOW) == text


def test_human_time_is_local_iso_with_the_offset() -> None:
    local = datetime.fromtimestamp((NOW - 180_000) / 1000).astimezone()
    assert human_time(NOW - 180_000, NOW) == (
        f"{local.isoformat(sep=' ', timespec='seconds')} (3 min ago)"
    )
    assert human_time(0, NOW) == "-"  # never


def test_a_table_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    long = "a-topic-name-much-longer-than-eighty-columns-" * 3
    print_table(
        ["TOPIC", Column("MESSAGES", numeric=True)], [[long, 1234567], ["b", 0]], title="topics"
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "topics"
    assert lines[1].split() == ["TOPIC", "MESSAGES"]
    # Not cut to a terminal's width, numbers right-aligned, no trailing blanks.
    assert lines[2].startswith(long) and lines[2].endswith("1,234,567")
    assert lines[3].endswith(" 0") and len(lines[3]) == len(lines[2])
    assert all(line == line.rstrip() for line in lines)


def test_an_empty_table_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(["A"], [], empty="no topics")
    out = capsys.readouterr()
    assert out.out == "" and "no topics" in out.err


def test_fields(capsys: pytest.CaptureFixture[str]) -> None:
    print_fields({"tx id": "x1", "next check": None, "checks": 2000, "done": True})
    assert capsys.readouterr().out.splitlines() == [
        "     tx id  x1",
        "next check  -",
        "    checks  2,000",
        "      done  yes",
    ]


def test_ago_of_never_is_a_dash() -> None:
    assert ago(0, NOW) == ago(None, NOW) == "-"
