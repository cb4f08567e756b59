"""Master → slave replication of the commit log (docs/cluster.md, "Replication").

A slave (``--replica-of``) follows its master's flushed log byte for byte (``slave.py``); the
master serves REPL_FETCH and tracks each slave's flushed offset, the gate of sync replication
(``master.py``); brokers of an elected group keep the history of master epochs their log went
through (``epochs.py``). This module holds the settings, read once at start.
"""

from __future__ import annotations

from dataclasses import dataclass

from txbroker.errors import InvalidArgument

__all__ = ["ReplicationSettings"]


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """The replication settings of ``ServerConfig`` in one place (read once, at start)."""

    # txb://host:port (txbs:// for TLS) of the master: this broker is a slave
    replica_of: str | None = None
    mode: str = "async"  # sync | async: what a master's write waits for
    min_insync: int = 1  # sync: slaves that must have flushed a write before its answer
    timeout_ms: int = 5_000  # sync: the longest a write waits for them

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise InvalidArgument(f"replication must be sync or async, got {self.mode!r}")
        if self.min_insync < 1:
            raise InvalidArgument(f"min_insync must be at least 1, got {self.min_insync}")
        if self.timeout_ms <= 0:
            raise InvalidArgument(f"replication_timeout_ms must be positive, got {self.timeout_ms}")
        if self.replica_of is not None and not self.replica_of.startswith(("txb://", "txbs://")):
            raise InvalidArgument(
                f"replica_of must be the master's txb://host:port (txbs:// for TLS), got "
                f"{self.replica_of!r}"
            )

    @property
    def slave(self) -> bool:
        return self.replica_of is not None
