"""The command line starts at once: building its parser, or sending one message, imports no
server, database, web or Spark library. Speed itself is `txbroker bench cli`'s to measure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, BrokerProcess, run_cli
from txbroker.bench.cli_bench import TARGET_S, CliBenchResult, CommandTimes, format_cli

# What a command that needs none of them must not pay for at start.
HEAVY = (
    "sqlalchemy",
    "starlette",
    "opentelemetry.sdk",
    "pyspark",
    "uvicorn",
    "rich",
    "txbroker.server",
    "txbroker.store",
    "txbroker.tx",
    "txbroker.chaos.campaign",
)
BENCHED = ("python -c pass", "txbroker --help", "txbroker send bench-cli --body x")


def _imported_by(code: str) -> list[str]:
    """The modules a fresh interpreter holds after ``code`` (its last line of stdout)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    modules: list[str] = json.loads(out.stdout.splitlines()[-1])
    return modules


def _heavy(modules: list[str]) -> list[str]:
    """Which of HEAVY (a package or any module in it) ``modules`` holds."""
    return [h for h in HEAVY if any(m == h or m.startswith(f"{h}.") for m in modules)]


def test_building_the_parser_imports_nothing_heavy() -> None:
    heavy = _heavy(_imported_by("from txbroker.cli import build_parser\nbuild_parser()"))
    assert heavy == [], f"building the parser imported {', '.join(heavy)}"


def test_send_imports_nothing_heavy(broker: BrokerProcess) -> None:
    assert run_cli("topic", "create", "t", "--server", broker.url).returncode == 0
    heavy = _heavy(
        _imported_by(
            "from txbroker.cli import main\n"
            f"assert main(['send', 't', '--body', 'x', '--server', '{broker.url}']) == 0"
        )
    )
    assert heavy == [], f"`txbroker send` imported {', '.join(heavy)}"


def test_bench_cli_prints_a_line_per_command(tmp_path: Path) -> None:
    out = run_cli("bench", "cli", "--runs", "2", "--data-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert tuple(line.split("  ")[1] for line in lines[1:]) == BENCHED, lines
    for line in lines[2:]:  # the txbroker commands, each with its verdict
        assert ("within the target" in line) != ("misses the target by" in line), line
    progress = [line.split(" (")[0] for line in out.stderr.splitlines()]
    assert progress == ["cli bench: run 1/2 done", "cli bench: run 2/2 done"]
    assert list(tmp_path.iterdir()) == []  # the broker stopped, its folder removed


def test_bench_cli_json() -> None:
    out = run_cli("bench", "cli", "--runs", "1", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["runs"] == 1 and res["target_s"] == TARGET_S
    assert res["python"]["command"] == BENCHED[0] and res["python"]["median_s"] > 0
    assert tuple(c["command"] for c in res["commands"]) == BENCHED[1:]
    for c in res["commands"]:
        assert c["within_target"] == (c["over_python_s"] <= TARGET_S)
        assert len(c["wall_s"]) == 1 and c["cpu_median_s"] >= 0
    assert out.stderr == ""  # --json: no progress either


def test_the_verdict_says_by_how_much_a_command_misses() -> None:
    def times(command: str, *wall_s: float) -> CommandTimes:
        return CommandTimes(command, wall_s, tuple(0.0 for _ in wall_s))

    res = CliBenchResult(
        times("python -c pass", 0.02, 0.01, 0.03),
        (times("quick", 0.1, 0.2, 0.15), times("slow", 0.4, 0.4, 0.5)),
    )
    assert res.within_target(res.commands[0]) and not res.within_target(res.commands[1])
    quick, slow = format_cli(res).splitlines()[2:]
    assert quick.endswith("+0.130 s  within the target")
    assert slow.endswith("+0.380 s  misses the target by 0.130 s")
