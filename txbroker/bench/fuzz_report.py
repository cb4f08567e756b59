"""What a fuzz run reports, and how the broker process is looked at from outside.

A run counts its cases and what each ended in (``outcomes``: one count per kind, such as
``refused PROTOCOL_ERROR`` or ``400 json``); a *crash* is what must never happen: the broker
gone, an ``INTERNAL`` answer (an exception a handler did not expect), an HTTP 5xx, a hang, or
the healthy client failing. The broker's resident memory is read before and after.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from txbroker.runtime.brokerproc import BrokerProcess

__all__ = ["FuzzReport", "LogWatch", "alive", "format_reports", "fuzz_broker", "rss_kib"]

# Crash examples kept per run, with the case's seed to replay it.
EXAMPLES_MAX: Final = 20


@dataclass
class FuzzReport:
    target: str  # "wire" or "http"
    seed: int
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    crashes: int = 0
    examples: list[str] = field(default_factory=list)  # "case 17 (seed 42): why"
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    # Tracebacks the broker logged during the run: each an exception something did not expect
    # (the HTTP server's own races included), whether or not a client saw it.
    tracebacks: int = 0
    healthy: dict[str, int] = field(default_factory=dict)  # sent, acked, consumed, missing

    def crash(self, case: int, why: str) -> None:
        self.crashes += 1
        if len(self.examples) < EXAMPLES_MAX:
            self.examples.append(f"case {case} (seed {self.seed}): {why}")

    def as_dict(self) -> dict[str, object]:
        return {
            "target": self.target,
            "seed": self.seed,
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "outcomes": dict(self.outcomes.most_common()),
            "crashes": self.crashes,
            "examples": self.examples,
            "rss_before_kib": self.rss_before_kib,
            "rss_after_kib": self.rss_after_kib,
            "tracebacks": self.tracebacks,
            "healthy": self.healthy,
        }


class LogWatch:
    """Counts the tracebacks a broker's log gains from now on (None: no log to read)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.start = self._size()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0

    def tracebacks(self) -> int:
        if self.path is None:
            return 0
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().count(b"Traceback (most recent call last)")


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def rss_kib(pid: int) -> int:
    """The process's resident set (VmRSS) in KiB; 0 if it is gone."""
    raw = _status(pid).get("VmRSS", "0 kB").split()[0]
    return int(raw) if raw.isdigit() else 0


def alive(pid: int) -> bool:
    """Running (a process that exited but was not waited for yet is a zombie: not alive)."""
    state = _status(pid).get("State", "")
    return bool(state) and not state.startswith(("Z", "X"))


@contextlib.contextmanager
def fuzz_broker(token: str, data_root: Path | None = None) -> Iterator[BrokerProcess]:
    """`txbroker serve` on free ports with an admin token and small files, in a temporary
    directory removed after; yields the started process."""
    root = Path(tempfile.mkdtemp(prefix="txb-fuzz-", dir=data_root))
    broker = BrokerProcess(
        root / "data",
        "--segment-mib",
        "8",
        "--auth-token",
        token,
        env={"TXB_INDEX_CAPACITY": "65536"},
    )
    try:
        yield broker.start()
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def format_reports(reports: list[FuzzReport]) -> str:
    """One row per target, then each target's outcomes by kind and any crash examples."""
    head = (
        f"{'target':<8}{'cases':>9}{'seconds':>9}{'crashes':>9}{'tracebacks':>12}"
        f"{'RSS before':>12}{'after':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.target:<8}{r.cases:>9,}{r.seconds:>9.1f}{r.crashes:>9}{r.tracebacks:>12}"
            f"{r.rss_before_kib / 1024:>8.1f} MiB{r.rss_after_kib / 1024:>6.1f} MiB"
        )
    for r in reports:
        lines += ["", f"{r.target}: outcomes by kind (seed {r.seed})"]
        lines += [f"  {n:>9,}  {kind}" for kind, n in r.outcomes.most_common()]
        if r.healthy:
            lines.append(
                "  healthy client: " + ", ".join(f"{k} {v:,}" for k, v in r.healthy.items())
            )
        lines += [f"  CRASH {e}" for e in r.examples]
    return "\n".join(lines)
