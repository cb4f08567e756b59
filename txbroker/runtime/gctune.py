"""The garbage collector's settings for a long-running server process.

CPython's cyclic collector runs a young collection every 700 net allocations of tracked objects
and, every 100 of those, a full collection over every object alive, as soon as the objects that
survived since the last one grow by a quarter. A broker allocates several tracked objects per
request (futures, tuples, transactions) and keeps many alive (the modules, the recently ended
transactions), so under transaction load the defaults cost it dearly: measured with
`txbroker bench tx` (64 producers) on the build machine, the collector took 2.1 s of a run of
62k transactions, 34 µs per transaction, in pauses up to 270 ms (full collections over ~140k
objects).

Two standard remedies, applied once the broker has started (its modules, configuration and
recovered state are then allocated): ``gc.freeze()`` moves everything alive to a permanent
generation no collection walks again, and a young threshold of 10,000 makes young collections
fourteen times rarer (still a few per second under load, each over at most that many objects).
In the same bench, collection time fell to 0.3 s and the longest pause to tens of milliseconds.
Cyclic garbage is still collected; only less often.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["YOUNG_THRESHOLD", "tune_for_serving"]

YOUNG_THRESHOLD: Final = 10_000


def tune_for_serving() -> None:
    """Freeze what is alive now and collect young objects less often (see the module)."""
    gc.collect()  # garbage from start-up goes now, not into the permanent generation
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
