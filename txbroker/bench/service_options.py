"""The service bench's options and result, and the names it uses (see ``service_bench`` for
what it measures and how)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "BREAKDOWN_MODES",
    "GROUP",
    "MODES",
    "OUTBOX_TOPIC",
    "PG_CALLERS",
    "SECRET",
    "SQLITE_CALLERS",
    "SUBSCRIBER_CONCURRENCY",
    "TX_TOPIC",
    "ServiceBenchOptions",
    "ServiceBenchResult",
    "messaging",
]

MODES: Final = ("baseline", "transactional", "outbox")
BREAKDOWN_MODES: Final = ("barrier-only", "messages-only")
GROUP: Final = "bench-orders"
SECRET: Final = "bench-service-secret"
TX_TOPIC: Final = "bench-tx"
OUTBOX_TOPIC: Final = "bench-outbox"
# Per subscription; the subscriber keeps up with the latency phase's rate with room to spare,
# and its connections (two subscriptions' worth) must fit PostgreSQL's max_connections beside
# the callers' pool.
SUBSCRIBER_CONCURRENCY: Final = 8
# Default callers (see service_bench's docstring).
PG_CALLERS: Final = 64
SQLITE_CALLERS: Final = 16


@dataclass(frozen=True)
class ServiceBenchOptions:
    database_url: str | None = None  # None: a SQLite file; else a PostgreSQL server
    orders: int = 5000  # per mode per run
    concurrency: int | None = None  # None: PG_CALLERS on PostgreSQL, SQLITE_CALLERS on SQLite
    latency_orders: int = 1000  # per messaging mode per run
    latency_rate: int = 200  # orders/s in the latency phase
    runs: int = 3
    broker_flush: str = "sync"
    data_root: Path | None = None
    slices: int = 4  # timed slices per mode per run
    breakdown: bool = False  # also time BREAKDOWN_MODES
    gc_freeze: bool = False  # gc.freeze() after the warm-up (see service_bench)

    @property
    def callers(self) -> int:
        if self.concurrency is not None:
            return self.concurrency
        return SQLITE_CALLERS if self.database_url is None else PG_CALLERS

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES + BREAKDOWN_MODES if self.breakdown else MODES


@dataclass(frozen=True)
class ServiceBenchResult:
    database: str
    broker_flush: str
    orders: int
    concurrency: int
    baseline_per_s: float
    transactional_per_s: float
    outbox_per_s: float
    transactional_ratio: float
    outbox_ratio: float
    latency_rate: int
    latency_orders: int
    transactional_latency: dict[str, float]
    outbox_latency: dict[str, float]
    latency_achieved_per_s: dict[str, float]
    back_checks: int
    outbox_backlog: int
    relay_duplicates: int
    applied_once: int  # orders checked to have exactly one applied row
    # The service process's CPU (callers, relay, check endpoint) per order in timed slices:
    # when it is near 1e6 / orders_per_s, the service's CPU is what limits throughput.
    cpu_us_per_order: dict[str, float]
    # That CPU time over the slices' wall time: near 1.0 on PostgreSQL, the service's one core
    # is the limit (on SQLite the driver's threads can take it past 1.0).
    busy: dict[str, float]
    # The part of it spent in the cyclic garbage collector, and how many objects were frozen.
    gc_us_per_order: dict[str, float]
    gc_frozen_objects: int
    # With ``breakdown``: orders/s of each BREAKDOWN_MODES mode over the baseline's, per run.
    breakdown_ratio: dict[str, float]
    breakdown_per_s: dict[str, float]


def messaging(mode: str) -> bool:
    """Whether the mode publishes (so its orders must each be applied once)."""
    return mode not in ("baseline", "barrier-only")
