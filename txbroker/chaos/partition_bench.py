"""`txbroker bench partition`'s runs: each partition scenario (txbroker/chaos/partitions.py) with
sync and async replication, each run on a fresh cluster on a test net of its own, and the
checker's figures per scenario over its runs.

    results = await bench_partitions(PartitionBench(kinds=("halves",), during_s=20), root, say)
    print(format_partitions(results))

With async replication a master acknowledges a write once it is in its own log, before any slave
has it: a master that loses the group keeps what its slaves had not copied, and a new master
goes on without it. Those losses are the scenario's *loss window*, reported, not failed; every
other anomaly fails a scenario in either mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from txbroker.chaos import netns
from txbroker.chaos.cluster import etcd_missing
from txbroker.chaos.history import Report, windows_p50_max
from txbroker.chaos.nemesis import PARTITIONS, Nemesis
from txbroker.chaos.netns import TestNet
from txbroker.chaos.partitions import FLAP, Timing, partition_cluster, run_partition

__all__ = [
    "KINDS",
    "MODES",
    "PartitionBench",
    "RunFigures",
    "ScenarioFigures",
    "bench_partitions",
    "format_partitions",
    "unavailable",
]

KINDS: Final = (*PARTITIONS, FLAP)
MODES: Final = ("sync", "async")


@dataclass(frozen=True, slots=True)
class PartitionBench:
    """What to run: each kind with each replication mode, ``runs`` times (one round of every
    scenario after another, so a load that changes over the bench falls on all of them)."""

    kinds: tuple[str, ...] = KINDS
    modes: tuple[str, ...] = MODES
    writers: int = 4
    before_s: float = 2.0
    during_s: float = 20.0
    after_s: float = 5.0
    runs: int = 1

    @property
    def timing(self) -> Timing:
        return Timing(self.writers, self.before_s, self.during_s, self.after_s)


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run: the checker's report, what was cut, how long the run took; or why it failed."""

    kind: str
    replication: str
    run: int
    seconds: float
    what: str = ""
    report: Report | None = None
    error: str = ""


@dataclass(slots=True)
class ScenarioFigures:
    """A kind with a replication mode over its runs: counts summed, unavailable windows pooled,
    the loss window from the earliest to the latest acknowledgement of a lost write."""

    kind: str
    replication: str
    runs: list[RunFigures] = field(default_factory=list)

    @property
    def reports(self) -> list[Report]:
        return [r.report for r in self.runs if r.report is not None]

    @property
    def errors(self) -> list[str]:
        return [r.error for r in self.runs if r.error]

    def total(self, count: Callable[[Report], int]) -> int:
        return sum(count(r) for r in self.reports)

    def unavailable_p50_max(self) -> tuple[float, float]:
        return windows_p50_max(w for r in self.reports for w in r.unavailable_s)

    def ack_latency(self, phase: str) -> tuple[float, float] | None:
        """Acknowledgement latency of attempts begun in ``phase`` ("before", "during",
        "after"), seconds: the median run's p50 and the highest run's p99; None when no run
        had an acknowledgement then."""
        got = [r.ack_latency_s[phase] for r in self.reports if phase in r.ack_latency_s]
        if not got:
            return None
        return statistics.median_low(q[0] for q in got), max(q[1] for q in got)

    def loss_window(self) -> tuple[float, float] | None:
        """Seconds after the cut of the first and the last acknowledgement of a lost write."""
        acked = [t for r in self.reports for t in r.lost_acked_s]
        return (min(acked), max(acked)) if acked else None

    @property
    def clean(self) -> bool:
        """Every run ran, and found no anomaly but, with async replication, losses."""
        allowed = (lambda r: r.losses) if self.replication == "async" else (lambda _r: 0)
        return not self.errors and all(r.anomalies == allowed(r) for r in self.reports)

    def as_dict(self) -> dict[str, Any]:
        p50, longest = self.unavailable_p50_max()
        window = self.loss_window()
        return {
            "kind": self.kind,
            "replication": self.replication,
            "runs": len(self.runs),
            "operations": self.total(lambda r: r.writes),
            "attempts": self.total(lambda r: r.attempts),
            "acknowledged": self.total(lambda r: r.acknowledged),
            "unknown": self.total(lambda r: r.unknown),
            "lost": self.total(lambda r: len(r.lost)),
            "duplicated": self.total(lambda r: len(r.duplicated)),
            "delivered_twice": self.total(lambda r: len(r.delivered_twice)),
            "out_of_order": self.total(lambda r: len(r.out_of_order)),
            "phantoms": self.total(lambda r: len(r.phantoms)),
            "vanished": self.total(lambda r: len(r.vanished)),
            "unavailable_p50_s": p50,
            "unavailable_max_s": longest,
            "loss_window_s": list(window) if window else None,
            "ack_p50_p99_s": {
                phase: list(q)
                for phase in ("before", "during", "after")
                if (q := self.ack_latency(phase)) is not None
            },
            "clean": self.clean,
            "each_run": [_run_dict(r) for r in self.runs],
        }


def _run_dict(r: RunFigures) -> dict[str, Any]:
    d: dict[str, Any] = {"run": r.run, "seconds": r.seconds, "what": r.what, "error": r.error}
    if r.report is not None:
        d["report"] = {**asdict(r.report), "errors": dict(r.report.errors)}
    return d


def unavailable() -> str | None:
    """Why the bench cannot run here (not root, no ``ip``/``iptables``, no etcd), or None."""
    return netns.unavailable() or etcd_missing()


async def bench_partitions(
    bench: PartitionBench, root: Path, say: Callable[[str], None]
) -> list[ScenarioFigures]:
    """Every scenario of ``bench``, each run's cluster and data under ``root`` (removed after
    the run) on a test net of its own (removed too, with every process in it, however the run
    ends: a failure, Ctrl-C or SIGTERM); ``say`` gets a line as each run starts and ends."""
    unknown = [k for k in bench.kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown partition {', '.join(unknown)}: {', '.join(KINDS)}")
    scenarios = {(k, m): ScenarioFigures(k, m) for k in bench.kinds for m in bench.modes}
    total, n, t0 = len(scenarios) * bench.runs, 0, time.monotonic()
    with _cancelled_on_sigterm():
        for i in range(1, bench.runs + 1):
            for (kind, mode), figures in scenarios.items():
                n += 1
                name = f"[{n}/{total}] {kind}, {mode} replication, run {i}/{bench.runs}"
                say(f"{name}: starting ({time.monotonic() - t0:.0f} s in)")
                run = await _one_run(bench, kind, mode, i, root / f"{kind}-{mode}-{i}")
                figures.runs.append(run)
                say(f"{name}: {run.seconds:.0f} s, {_outcome(run)}")
    return list(scenarios.values())


async def _one_run(bench: PartitionBench, kind: str, mode: str, i: int, where: Path) -> RunFigures:
    """A failure of the run is its figures' error (the next scenario still runs); an interrupt
    is not."""
    t0 = time.monotonic()
    try:
        with TestNet() as net:
            async with partition_cluster(where, net, mode, kind=kind) as cluster:
                report, what = await run_partition(cluster, Nemesis(net), kind, bench.timing)
    except Exception as e:  # a failed run is a figure: which run, and why
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # Ctrl-C or SIGTERM while it failed: the bench stops
        return RunFigures(kind, mode, i, time.monotonic() - t0, error=f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(where, ignore_errors=True)
    return RunFigures(kind, mode, i, time.monotonic() - t0, what, report)


def _outcome(run: RunFigures) -> str:
    if run.report is None:
        return f"FAILED: {run.error}"
    r = run.report
    p50, longest = r.unavailable_p50_max()
    return (
        f"{r.writes:,} operations, {r.acknowledged:,} acknowledged, {len(r.lost)} lost, "
        f"{len(r.vanished)} vanished, {r.anomalies - r.losses} other anomalies, unavailable "
        f"p50 {p50:.2f} s max {longest:.2f} s; {run.what}"
    )


@contextlib.contextmanager
def _cancelled_on_sigterm() -> Iterator[None]:
    """SIGTERM cancels the running bench as Ctrl-C does, so its nets and processes go with it."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


HEADERS: Final = (
    "scenario",
    "replication",
    "operations",
    "acknowledged",
    "lost",
    "duplicated",
    "out of order",
    "phantoms",
    "vanished",
    "unavailable s p50 / max",
    "ack ms p50 / p99 before, in the fault",
    "loss window",
)


# The table's counts, as_dict's keys, in HEADERS' order.
_COUNTS: Final = (
    "operations",
    "acknowledged",
    "lost",
    "duplicated",
    "out_of_order",
    "phantoms",
    "vanished",
)


def _rows(results: list[ScenarioFigures]) -> list[list[str]]:
    out = []
    for s in results:
        if not s.reports:
            out.append([s.kind, s.replication, *["-"] * (len(HEADERS) - 3), "failed"])
            continue
        d = s.as_dict()
        window = s.loss_window()
        if s.replication == "sync":
            loss = "-"  # nothing acknowledged may be lost: a loss is in the lost column, failed
        elif window is None:
            loss = "none lost"
        else:
            loss = f"acknowledged {window[0]:+.2f} .. {window[1]:+.2f} s from the cut"
        out.append(
            [
                s.kind,
                s.replication,
                *(f"{d[k]:,}" for k in _COUNTS),
                f"{d['unavailable_p50_s']:.2f} / {d['unavailable_max_s']:.2f}",
                f"{_ms(s.ack_latency('before'))}, {_ms(s.ack_latency('during'))}",
                loss,
            ]
        )
    return out


def _ms(q: tuple[float, float] | None) -> str:
    return "-" if q is None else f"{q[0] * 1000:.0f} / {q[1] * 1000:.0f}"


def format_partitions(results: list[ScenarioFigures]) -> str:
    """The table (Markdown, as docs/benchmarks.md takes it), then a line per run: what was cut,
    and any failure or anomaly."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(results)]
    lines.append("")
    for s in results:
        verdict = "clean" if s.clean else "NOT CLEAN"
        for r in s.runs:
            lines.append(f"{s.kind}, {s.replication}, run {r.run} ({verdict}): {r.what or r.error}")
    return "\n".join(lines)
