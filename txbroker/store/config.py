"""Store configuration: one frozen object, built once at startup and validated there."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker.errors import InvalidArgument
from txbroker.store.record import HEADER, MAX_BODY_BYTES, MAX_PROPERTIES_BYTES, MAX_TOPIC_BYTES

__all__ = ["FlushMode", "StoreConfig"]

MiB: Final = 1024 * 1024


class FlushMode(enum.StrEnum):
    SYNC = "sync"  # acknowledge after fdatasync covers the record (group commit)
    ASYNC = "async"  # acknowledge after the write; fdatasync every flush_interval_ms


@dataclass(frozen=True, slots=True)
class StoreConfig:
    data_dir: Path
    flush: FlushMode = FlushMode.SYNC
    # 256 MiB segments: few enough files for a long retention, small enough that deleting one
    # frees space in useful steps (RocketMQ uses 1 GiB, Kafka 1 GiB; we favour finer retention).
    segment_bytes: int = 256 * MiB
    max_body_bytes: int = MAX_BODY_BYTES
    flush_interval_ms: int = 500
    # How often queue/index files are made durable and the checkpoint moved: bounds how much
    # log recovery must replay after a crash (about one interval of traffic).
    checkpoint_interval_ms: int = 1000
    # How often the key index joins a checkpoint: its hash slots take writes at random places,
    # so each flush of it writes most of its 4 MiB slot area however little was indexed, a
    # burst the log's group commits queue behind. Recovery re-indexes from the log what the last
    # index flush did not cover: about this much traffic, scanned at start-up after a crash.
    index_flush_interval_ms: int = 10_000
    # 300k entries x 20 bytes = 5.7 MiB per consume-queue file, RocketMQ's default.
    cq_entries_per_file: int = 300_000
    # 1 Mi slots (4 MiB) and 2 Mi entries (48 MiB) per index file: chains stay ~2 long, and
    # rebuilding the active file after a crash takes about a second.
    index_slots: int = 1 << 20
    index_capacity: int = 2 << 20
    retention_ms: int | None = 72 * 3600 * 1000
    retention_bytes: int | None = None
    retention_check_interval_ms: int = 10_000
    # Reads of the newest bytes come from the mapping on the event loop (they are in the page
    # cache: just written); older reads go to a worker thread so a disk read never stalls it.
    hot_read_bytes: int = 64 * MiB
    # When recovery finds damage followed by valid records it refuses to open (the records after
    # it may have been acknowledged). An operator who accepts losing them sets this to truncate.
    truncate_damaged_tail: bool = False

    def __post_init__(self) -> None:
        largest = HEADER.size + MAX_TOPIC_BYTES + MAX_PROPERTIES_BYTES + self.max_body_bytes
        if not 0 <= self.max_body_bytes <= MAX_BODY_BYTES:
            raise InvalidArgument(f"max_body_bytes must be within 0..{MAX_BODY_BYTES}")
        if self.segment_bytes < largest:
            raise InvalidArgument(
                f"segment_bytes={self.segment_bytes} cannot hold the largest record ({largest} "
                "bytes); raise it or lower max_body_bytes"
            )
        for name in (
            "flush_interval_ms",
            "checkpoint_interval_ms",
            "index_flush_interval_ms",
            "cq_entries_per_file",
            "retention_check_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if self.index_slots <= 0 or self.index_capacity <= 0:
            raise InvalidArgument("index_slots and index_capacity must be positive")
        if self.retention_ms is not None and self.retention_ms <= 0:
            raise InvalidArgument("retention_ms must be positive (or None to keep by age)")
        if self.retention_bytes is not None and self.retention_bytes < self.segment_bytes:
            raise InvalidArgument("retention_bytes must be at least one segment")
