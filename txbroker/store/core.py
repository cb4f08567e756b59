"""What a message store is made of, and the state it is in.

``StoreCore`` holds the store's parts (its directory, the commit log, the key index, the
consume queues, the group committer) and the one guarded transition function of its state.
The store's behaviour is split by concept over classes that extend it: the read paths
(``txbroker.store.reads``), checkpoints and retention (``txbroker.store.maintenance``), and
``MessageStore`` itself (``txbroker.store.store``: opening, closing and appending), which
combines them. They share these attributes directly, as methods of one class would, so
splitting the code added no call to any append or read.
"""

from __future__ import annotations

import asyncio
import enum
from pathlib import Path
from typing import TYPE_CHECKING

from txbroker.errors import StoreClosed
from txbroker.store.checkpoint import ShutdownMarker, TailCut
from txbroker.store.commitlog import CommitLog
from txbroker.store.config import FlushMode, StoreConfig
from txbroker.store.consumequeue import ConsumeQueue
from txbroker.store.fences import Fences
from txbroker.store.flush import GroupCommitter
from txbroker.store.keyindex import KeyIndex
from txbroker.store.recovery import RecoveryReport

if TYPE_CHECKING:
    from txbroker.store.replica import ReplicationGate

__all__ = ["StoreCore", "StoreState"]


class StoreState(enum.Enum):
    CREATED = "created"
    RECOVERING = "recovering"
    OPEN = "open"
    FAILED = "failed"  # an fsync failed: reads work, appends refused
    CLOSING = "closing"
    CLOSED = "closed"


_ALLOWED: dict[StoreState, frozenset[StoreState]] = {
    StoreState.CREATED: frozenset({StoreState.RECOVERING, StoreState.CLOSED}),
    StoreState.RECOVERING: frozenset({StoreState.OPEN, StoreState.CLOSED}),
    StoreState.OPEN: frozenset({StoreState.FAILED, StoreState.CLOSING}),
    StoreState.FAILED: frozenset({StoreState.CLOSING}),
    StoreState.CLOSING: frozenset({StoreState.CLOSED}),
    StoreState.CLOSED: frozenset(),
}


class StoreCore:
    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self.dir = Path(config.data_dir)
        self._state = StoreState.CREATED
        self._sync = config.flush is FlushMode.SYNC
        self.log = CommitLog(self.dir / "commitlog", config.segment_bytes, buffered=self._sync)
        self.index = KeyIndex(self.dir / "index", config.index_slots, config.index_capacity)
        self._cq_root = self.dir / "consumequeue"
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._topic_bytes: dict[str, bytes] = {}
        self._dirty_queues: set[ConsumeQueue] = set()
        self._marker = ShutdownMarker(self.dir)
        self._tail_cut = TailCut(self.dir)
        self._cut_at: int | None = None  # where a failed write cut the log (TailCut)
        self.fences = Fences()  # deleted topics (see fences.py); set before opening
        self._lock_fd = -1
        self._committer: GroupCommitter | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.recovery: RecoveryReport | None = None
        self._max_body = config.max_body_bytes
        # Sync replication (txbroker.store.replica): None unless the broker installs one, so
        # a store without replicas waits on the group commit alone, as before.
        self.replication_gate: ReplicationGate | None = None

    def _transition(self, to: StoreState) -> None:
        if to not in _ALLOWED[self._state]:
            raise AssertionError(f"store cannot go from {self._state.value} to {to.value}")
        self._state = to

    @property
    def state(self) -> StoreState:
        return self._state

    def _check_open(self) -> None:
        if self._state is not StoreState.OPEN:
            if self._state is StoreState.FAILED and self._committer is not None:
                assert self._committer.failure is not None
                raise self._committer.failure
            raise StoreClosed(f"the store is {self._state.value}")
        if self._committer is not None and self._committer.failure is not None:
            self._transition(StoreState.FAILED)
            raise self._committer.failure

    def _check_readable(self) -> None:
        if self._state not in (StoreState.OPEN, StoreState.FAILED):
            raise StoreClosed(f"the store is {self._state.value}")
