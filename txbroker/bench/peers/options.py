"""`bench peers` options, read once from the command line into a frozen record."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["FLUSH_MODES", "PEERS", "WORKLOADS", "PeersOptions"]

PEERS: Final = ("rabbitmq-classic", "rabbitmq-quorum", "nats-file")
FLUSH_MODES: Final = ("sync", "async")
WORKLOADS: Final = ("single", "batch", "e2e")


@dataclass(frozen=True, slots=True)
class PeersOptions:
    messages: int = 20_000  # per system, workload and round (single and batch)
    window: int = 128  # messages in flight, as `bench produce --inflight 128`, so figures compare
    size: int = 1024  # body bytes
    batch: int = 32  # messages per batch, as `bench produce --batch 32`
    rounds: int = 3  # interleaved rounds; the figures are their medians
    rate: int = 5000  # e2e messages per second
    e2e_seconds: float = 5.0  # how long e2e publishes
    # A cap per system, workload and round: a slow peer must not hold the run for minutes.
    duration_s: float = 60.0
    peers: tuple[str, ...] = PEERS
    flush: tuple[str, ...] = FLUSH_MODES
    workloads: tuple[str, ...] = WORKLOADS
    rabbitmq_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    nats_url: str = "nats://127.0.0.1:4222"
    data_root: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        assert set(self.peers) <= set(PEERS), self.peers
        assert set(self.flush) <= set(FLUSH_MODES), self.flush
        assert set(self.workloads) <= set(WORKLOADS), self.workloads

    def public(self) -> dict[str, object]:
        """The options as JSON shows them (URLs without passwords)."""
        return {
            "messages": self.messages,
            "window": self.window,
            "size": self.size,
            "batch": self.batch,
            "rounds": self.rounds,
            "rate": self.rate,
            "e2e_seconds": self.e2e_seconds,
            "duration_s": self.duration_s,
            "peers": list(self.peers),
            "flush": list(self.flush),
            "workloads": list(self.workloads),
        }
