"""The garbage collector's settings for a long-running server process.

A broker allocates several tracked objects per request (futures, tuples, transactions) and keeps
many alive (its modules, the recently ended transactions), so CPython's defaults (a young
collection every 700 allocations, full ones over everything alive) cost it long pauses under
transaction load (docs/benchmarks.md, "Performance round"). Once the broker has started and
recovered, ``gc.freeze()`` moves everything alive out of every collection's reach, and a young
threshold of 10,000 makes young collections rarer. Cyclic garbage is still collected.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["YOUNG_THRESHOLD", "tune_for_serving"]

# Still a few young collections a second under load, each over at most this many objects
# (docs/benchmarks.md, "Performance round", for the tx bench with and without it).
YOUNG_THRESHOLD: Final = 10_000


def tune_for_serving() -> None:
    """Freeze what is alive now and collect young objects less often (see the module)."""
    gc.collect()  # garbage from start-up goes now, not into the permanent generation
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
