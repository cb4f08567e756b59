"""`txbroker bench cli`: how long the command line takes to start, beside ``python -c pass``.

Every command runs as a fresh process, ``runs`` times, the commands taking turns so that a busy
machine slows them alike; one unmeasured run of each first writes the bytecode and warms the
page cache. ``send`` goes to a broker started here (a real ``txbroker serve`` on free ports in a
temporary folder, flushing asynchronously), stopped afterwards.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from txbroker.runtime.brokerproc import BrokerProcess

__all__ = ["TARGET_S", "CliBenchResult", "CommandTimes", "bench_cli", "format_cli"]

# The command line's start-up target: a command answers within a quarter second of a bare
# interpreter, so that shell loops and scripts calling it stay quick (docs/benchmarks.md).
TARGET_S: Final = 0.25
TOPIC: Final = "bench-cli"
# The module, as BrokerProcess starts the broker: the same wherever the console script went.
_TXBROKER: Final = (sys.executable, "-m", "txbroker.cli")


@dataclass(frozen=True, slots=True)
class CommandTimes:
    """One command's runs: wall-clock time and CPU time (user + system) of each process."""

    command: str  # as a person types it
    wall_s: tuple[float, ...]
    cpu_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.wall_s)

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "median_s": round(self.median_s, 4),
            "cpu_median_s": round(statistics.median(self.cpu_s), 4),
            "wall_s": [round(s, 4) for s in self.wall_s],
        }


@dataclass(frozen=True, slots=True)
class CliBenchResult:
    python: CommandTimes  # python -c pass: the interpreter's own start-up
    commands: tuple[CommandTimes, ...]  # txbroker --help, txbroker send

    def over_python_s(self, c: CommandTimes) -> float:
        return c.median_s - self.python.median_s

    def within_target(self, c: CommandTimes) -> bool:
        return self.over_python_s(c) <= TARGET_S

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": len(self.python.wall_s),
            "target_s": TARGET_S,
            "python": self.python.as_dict(),
            "commands": [
                {
                    **c.as_dict(),
                    "over_python_s": round(self.over_python_s(c), 4),
                    "within_target": self.within_target(c),
                }
                for c in self.commands
            ],
        }


def bench_cli(
    runs: int,
    data_root: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CliBenchResult:
    root = Path(tempfile.mkdtemp(prefix="txb-cli-", dir=data_root))
    # Flushed asynchronously: send's figure is its start and one round trip, not an fsync.
    broker = BrokerProcess(root / "broker", "--flush", "async")
    try:
        broker.start()
        _run([*_TXBROKER, "topic", "create", TOPIC, "--queues", "1", "--server", broker.url])
        commands: dict[str, Sequence[str]] = {
            "python -c pass": (sys.executable, "-c", "pass"),
            "txbroker --help": (*_TXBROKER, "--help"),
            f"txbroker send {TOPIC} --body x": (
                *_TXBROKER, "send", TOPIC, "--body", "x", "--server", broker.url
            ),
        }  # fmt: skip
        for argv in commands.values():
            _run(argv)  # warm-up, not measured
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for i in range(runs):
            if progress is not None:
                progress(i, runs)
            for name, argv in commands.items():
                times[name].append(_run(argv))
        if progress is not None:
            progress(runs, runs)
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    python, *rest = (
        CommandTimes(name, tuple(w for w, _ in t), tuple(c for _, c in t))
        for name, t in times.items()
    )
    return CliBenchResult(python, tuple(rest))


def _run(argv: Sequence[str]) -> tuple[float, float]:
    """Run ``argv`` to its end: its wall-clock and CPU seconds. Raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # counts waited-for children only
    t0 = time.perf_counter()
    out = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {out.returncode}: {out.stderr.strip()}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def format_cli(res: CliBenchResult) -> str:
    runs = len(res.python.wall_s)
    width = max(len(c.command) for c in (res.python, *res.commands))
    lines = [
        f"cli bench: start-up, median of {runs} run(s), each a fresh process "
        f"(target: within {TARGET_S} s of python -c pass)",
        f"  {res.python.command:<{width}}  {res.python.median_s:6.3f} s",
    ]
    for c in res.commands:
        over = res.over_python_s(c)
        verdict = (
            "within the target"
            if res.within_target(c)
            else f"misses the target by {over - TARGET_S:.3f} s"
        )
        lines.append(f"  {c.command:<{width}}  {c.median_s:6.3f} s  {over:+7.3f} s  {verdict}")
    return "\n".join(lines)
