"""Several broker groups' logs read as one (``--log GROUP=DIR``), in the local session: every
group's log has a segment ``00000000000000000000``, so positions and incremental marks are per
group; a message id stored by two groups is a duplicate, listed once however many runs kept
it; and the options name a log given wrong."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import small_config
from txbroker.store import Message, MessageStore
from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.options import JobOptions, LogSpec, ServiceSpec, parse_args
from txbroker_reconcile.run import _Progress, reconcile

N = 40  # messages per group and write: one segment each, as every group's first


async def _append(data_dir: Path, ids: list[str]) -> None:
    store = await MessageStore.open(small_config(data_dir / "store"))
    try:
        await store.append_batch([Message("orders", b"body", 0, {"id": i}) for i in ids])
    finally:
        await store.close()


def _ids(group: str, start: int, n: int) -> list[str]:
    return [f"{group}-m{i:04d}" for i in range(start, start + n)]


def test_groups_are_read_as_one_and_incrementally_each_from_its_own_mark(
    spark: Any, tmp_path: Path, service_db: str
) -> None:
    g1, g2 = tmp_path / "g1", tmp_path / "g2"
    asyncio.run(_append(g1, [*_ids("g1", 0, N), "shared"]))
    asyncio.run(_append(g2, [*_ids("g2", 0, N), "shared"]))
    opts = JobOptions(
        services=(ServiceSpec("svc", service_db, "svc"),),
        log=None,
        logs=(LogSpec("g1", g1), LogSpec("g2", g2)),
        out=tmp_path / "out",
        grace_s=0,
        state=tmp_path / "state",
        progress=False,
    )

    def run() -> dict[str, Any]:
        return reconcile(opts, _Progress(None, False), spark)  # type: ignore[arg-type]

    first = run()
    groups = first["inputs"]["log"]["groups"]
    assert {g: (v["records"], v["read_this_run"]) for g, v in groups.items()} == {
        "g1": (N + 1, N + 1),
        "g2": (N + 1, N + 1),
    }
    marks = json.loads((tmp_path / "state" / "watermark.json").read_text())["log"]
    assert sorted(marks) == [f"g1/{0:020d}", f"g2/{0:020d}"]
    assert marks[f"g1/{0:020d}"] == marks[f"g2/{0:020d}"]  # the same records' sizes

    asyncio.run(_append(g2, _ids("g2", N, N)))  # g2 moves on, g1 does not
    second = run()
    groups = second["inputs"]["log"]["groups"]
    assert {g: (v["records"], v["read_this_run"]) for g, v in groups.items()} == {
        "g1": (N + 1, 0),
        "g2": (2 * N + 1, N),
    }
    assert second["topics"][0]["messages"] == 3 * N + 2  # nothing counted twice
    for summary in (first, second):
        assert summary["by_reason"] == [
            {
                "kind": "duplicate",
                "reason": "one message in two broker groups",
                "topic": "orders",
                "count": 1,
            }
        ]
        shared = [e for e in summary["examples"] if e["id"] == "shared"]
        assert [(e["group"], e["copies"]) for e in shared] == [("g1,g2", 2)]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Broker groups" in html and str(g2) in html


def test_one_log_is_one_broker_as_before(tmp_path: Path) -> None:
    opts = parse_args(["--service", "a=sqlite:///a.db", "--out", "x", "--log", str(tmp_path)])
    assert opts.log == tmp_path and opts.logs == ()
    assert opts.log_specs == (LogSpec("", tmp_path),)
    # A path holding "=" after a "/" is a path, not a group.
    odd = tmp_path / "a=b"
    assert parse_args(["--service", "a=sqlite:///a.db", "--out", "x", "--log", str(odd)]).log == odd


@pytest.mark.parametrize(
    ("logs", "says"),
    [
        (["g1=/a", "/b"], "with several logs, name each one's broker group"),
        (["g1=/a", "g1=/b"], "--log g1 is given twice"),
        (["g1="], "expected GROUP=DIR"),
    ],
)
def test_logs_given_wrong_are_named(logs: list[str], says: str) -> None:
    argv = ["--service", "a=sqlite:///a.db", "--out", "x"]
    with pytest.raises(CannotRun, match=says):
        parse_args([*argv, *(a for log in logs for a in ("--log", log))])


def test_a_group_whose_log_is_missing_is_named(
    tmp_path: Path, service_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from txbroker_reconcile.run import EXIT_CANNOT_RUN, main

    argv = ["--service", f"svc={service_db}", "--out", str(tmp_path / "o")]
    code = main([*argv, "--log", f"g1={tmp_path}", "--log", f"g2={tmp_path / 'nowhere'}"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_CANNOT_RUN and f"--log g2={tmp_path / 'nowhere'}: no such directory" in err
