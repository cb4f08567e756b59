"""Replication lag under load, for `txbroker bench produce --replicas N`.

While the replicated run produces, a thread reads the ``txbroker_store_flushed_bytes`` gauge
from every slave's ``GET /metrics`` a few times a second, each time between two readings of the
master's. A slave's log sits at the master's offsets (docs/cluster.md, "Replication"), so the
difference is how far the slave is behind the master's flushed log, in bytes and in time
(:class:`LagSampler` says how each reading is placed).
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Sequence

__all__ = ["INTERVAL_S", "LagSampler"]

INTERVAL_S = 0.2
_GAUGE = "txbroker_store_flushed_bytes"
Series = list[tuple[float, int]]  # (perf_counter, flushed offset), in time order


def flushed(http: str) -> tuple[float, int]:
    """``(when, offset)``: the broker's flushed offset from its /metrics."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{http}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    when = (t0 + time.perf_counter()) / 2
    for line in text.splitlines():
        if line.startswith(_GAUGE):
            return when, int(float(line.rsplit(" ", 1)[1]))
    raise ValueError(f"{http}/metrics has no {_GAUGE}")


class LagSampler:
    """``with LagSampler(master_http, slave_https): produce()``, then ``summary()``.

    The figure is what ``ReplicaTracker.status()`` holds as the slaves last reported it, which
    no endpoint serves. Each reading is stamped with the middle of its request; after the run
    every slave reading is set against the master's flushed offset interpolated at that instant
    between the two master readings around it (bytes behind), and against the instant the
    master's flushed offset had reached the slave's (time behind: how old the newest record the
    slave has flushed is)."""

    def __init__(self, master: str, slaves: Sequence[str], interval_s: float = INTERVAL_S):
        self.master, self.slaves, self.interval_s = master, list(slaves), interval_s
        self.master_series: Series = []
        self.slave_series: list[Series] = [[] for _ in self.slaves]
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txb-lag-sampler", daemon=True)

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _read(self, http: str, into: Series) -> None:
        try:
            into.append(flushed(http))
        except (OSError, ValueError):
            self.errors += 1

    def _run(self) -> None:
        while True:
            self._read(self.master, self.master_series)
            for http, series in zip(self.slaves, self.slave_series, strict=True):
                self._read(http, series)
            self._read(self.master, self.master_series)  # the slaves' readings between two
            if self._stop.wait(self.interval_s):
                break

    def summary(self) -> dict[str, float]:
        """Over every slave's readings: bytes and milliseconds behind, p50, p99 and max."""
        behind_b: list[float] = []
        behind_ms: list[float] = []
        m = self.master_series
        for series in self.slave_series:
            for t, off in series:
                head = _offset_at(m, t)
                if head is None:
                    continue
                behind_b.append(max(head - off, 0.0))
                reached = t if off >= head else _time_reached(m, off)
                if reached is not None:
                    behind_ms.append(max(t - reached, 0.0) * 1000)
        return {
            "samples": len(behind_b),
            "errors": self.errors,
            **_quantiles("bytes", behind_b),
            **_quantiles("ms", behind_ms),
        }


def _offset_at(series: Series, t: float) -> float | None:
    """The offset at ``t``, linear between readings; None outside them."""
    for (t1, o1), (t2, o2) in itertools.pairwise(series):
        if t1 <= t <= t2:
            return o1 + (o2 - o1) * ((t - t1) / (t2 - t1) if t2 > t1 else 1.0)
    return None


def _time_reached(series: Series, off: int) -> float | None:
    """When the offset reached ``off``, linear between readings; None if before the first."""
    for (t1, o1), (t2, o2) in itertools.pairwise(series):
        if o1 < off <= o2:
            return t1 + (t2 - t1) * (off - o1) / (o2 - o1)
    return None


def _quantiles(unit: str, values: list[float]) -> dict[str, float]:
    v = sorted(values) or [0.0]

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 3)

    return {f"{unit}_p50": at(0.5), f"{unit}_p99": at(0.99), f"{unit}_max": round(v[-1], 3)}
