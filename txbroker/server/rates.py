"""Rates for operators: counters sampled once a second (off the request paths), the rate of
each over the last minute. The broker keeps no per-message statistics; a topic's rate is how
fast its queues' end offsets grew, a group's how fast its committed offsets did."""

from __future__ import annotations

import collections
from collections.abc import Hashable, Mapping
from typing import Final, Generic, TypeVar

__all__ = ["WINDOW_S", "Rates"]

K = TypeVar("K", bound=Hashable)
WINDOW_S: Final = 60.0
# A rate over less than this would be noise (one sample apart from the start).
MIN_SPAN_S: Final = 2.0


class Rates(Generic[K]):
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window = window_s
        self._samples: collections.deque[tuple[float, dict[K, int]]] = collections.deque()

    def add(self, now: float, counts: Mapping[K, int]) -> None:
        """A sample of every counter at ``now`` (monotonic seconds)."""
        self._samples.append((now, dict(counts)))
        # Keep the newest sample at least a window old, so the rate spans the whole window.
        while len(self._samples) > 2 and self._samples[1][0] <= now - self._window:
            self._samples.popleft()

    def rate(self, key: K) -> float | None:
        """Per second over the window (or as much of it as was sampled); None before there are
        two samples of ``key`` at least MIN_SPAN_S apart. A counter that went back (a topic
        deleted and created again) counts from where it went back."""
        if not self._samples:
            return None
        t1, last = self._samples[-1]
        if key not in last:
            return None
        for t0, first in self._samples:
            if key in first:
                span = t1 - t0
                if span < MIN_SPAN_S:
                    return None
                return max(last[key] - first[key], 0) / span
        return None
