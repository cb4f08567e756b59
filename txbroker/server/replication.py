"""Master → slave replication of the commit log, the broker's side (issue 22, item 4).

A slave (``txbroker serve --replica-of txb://MASTER``) runs :class:`~txbroker.server.replicator
.Replicator`: it sends REPL_FETCH {from_offset = the end of its log, flushed_offset} to the
master, writes the answer's bytes verbatim at the same offsets, fdatasyncs, and replays them
into its consume queues and key index (``txbroker.store.replica``). The master answers from
its flushed log only, so a slave never holds a record the master could lose.

The master (this module) keeps each slave's reported flushed offset in a
:class:`ReplicaTracker`. With ``--replication sync --min-insync N`` the tracker is installed as
the store's replication gate: a write's answer (sends, batches, transactions: they all wait on
``store.durable_together()``/``durable()``) goes out once N slaves have reported the log
flushed past it, or fails with ``REPLICATION_TIMEOUT`` after ``--replication-timeout-ms``.
With ``async`` (the default) writes are answered after the master's own flush, as without
slaves. See docs/cluster.md, "Replication".
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from txbroker.errors import InvalidArgument, NotMaster, ReplicationTimeout
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import ReplFetchRequest, ReplFetchResponse
from txbroker.server.connection import DirectHandler, Handler
from txbroker.server.epochs import EpochHistory
from txbroker.store import MessageStore

__all__ = [
    "GROUP_MEMBERSHIP",
    "MAX_FETCH_BYTES",
    "ReplicaTracker",
    "ReplicationSettings",
    "fetch_handler",
    "refuse_writes",
]

log = logging.getLogger(__name__)

# A fetch answer is one frame (16 MiB at most, frames.MAX_FRAME_BYTES); 8 MiB leaves room for
# one whole record of the largest size (4 MiB body + 32 KiB properties) past the bound.
MAX_FETCH_BYTES: Final = 8 << 20
# A fetch with nothing new is held at most this long: bounded like a consumer's long poll, short
# enough that a slave's report of its flushed offset is never older than this when idle.
MAX_FETCH_WAIT_MS: Final = 30_000
# Requests a slave refuses: every one that writes the log, topics (whose registry a slave takes
# from its master) or a group's committed offsets (a slave holds its master's, copied).
WRITES: Final = (
    Opcode.SEND,
    Opcode.SEND_BATCH,
    Opcode.TX_PREPARE,
    Opcode.TX_END,
    Opcode.TX_RESOLVE,
    Opcode.ACK,
    Opcode.NACK,
    Opcode.DLQ_REDRIVE,
    Opcode.TOPIC_CREATE,
    Opcode.TOPIC_DELETE,
)
# What else a broker of an elected group serves only as master: a consumer group lives on its
# group's master. A slave there may still hold a tail no later master has (it learns so only
# when it next fetches), and a position read on it could pass records the master writes there.
GROUP_MEMBERSHIP: Final = (Opcode.HEARTBEAT, Opcode.PULL, Opcode.LEAVE)


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """The replication settings of ``ServerConfig`` in one place (read once, at start)."""

    replica_of: str | None = None  # txb://host:port of the master: this broker is a slave
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
        if self.replica_of is not None and not self.replica_of.startswith("txb://"):
            raise InvalidArgument(
                f"replica_of must be the master's txb://host:port, got {self.replica_of!r}"
            )

    @property
    def slave(self) -> bool:
        return self.replica_of is not None


@dataclass(slots=True)
class _Batch:
    """Writes waiting for the same replication: one future and one timer for all of them."""

    target: int  # the log offset the replicas must have flushed
    fut: asyncio.Future[None]
    timer: asyncio.TimerHandle | None = None


class ReplicaTracker:
    """Each slave's reported flushed offset, and (sync replication) the store's gate.

    Writers join the open batch (its target rises to their offset); a slave's report closes it,
    so a batch waits for at most one more fetch round than its first write, and under load
    one future and one timer serve every write of a round, as one group commit does."""

    def __init__(
        self,
        store: MessageStore,
        min_insync: int,
        timeout_s: float,
        *,
        covered: int | None = None,
    ) -> None:
        self._store = store
        self._loop = asyncio.get_running_loop()
        self.min_insync = min_insync
        self._timeout_s = timeout_s
        self.replicas: dict[str, int] = {}  # slave name -> flushed offset it reported
        self.seen_s: dict[str, float] = {}  # slave name -> monotonic time of its last report
        # The log is flushed on min_insync slaves below this; consumers read below it too. What
        # the log held when the tracker was made counts as covered (an elected master's term
        # begins with it; a master's log before this run is what it was).
        self.covered = store.flushed_offset if covered is None else covered
        self._batches: collections.deque[_Batch] = collections.deque()
        self._open: _Batch | None = None
        self.timeouts = 0

    # --- the gate (txbroker.store.replica.ReplicationGate) --------------------------------

    def covering(self, offset: int) -> asyncio.Future[None]:
        # The slaves fetch flushed bytes only: start the master's flush of this write now
        # (joining the group commit's shared wait), or it would wait for the next interval.
        self._store.committer.durable_together()
        b = self._open
        if b is None or b.fut.done():
            if offset <= self.covered:
                fut = self._loop.create_future()
                fut.set_result(None)
                return fut
            b = self._open = _Batch(offset, self._loop.create_future())
            b.timer = self._loop.call_at(self._loop.time() + self._timeout_s, self._expire, b)
            batches = self._batches
            while batches and batches[0].fut.done():  # timed out with no report since
                batches.popleft()
            batches.append(b)
        elif offset > b.target:
            b.target = offset
        return b.fut

    def _expire(self, b: _Batch) -> None:
        if b.fut.done():
            return
        if self._open is b:
            self._open = None
        self.timeouts += 1
        failure = self._store.committer.failure
        if failure is not None:
            b.fut.set_exception(failure)
            return
        insync = sum(1 for off in self.replicas.values() if off >= b.target)
        b.fut.set_exception(
            ReplicationTimeout(
                f"sync replication: {insync} of the {self.min_insync} slaves needed flushed "
                f"the write (log offset {b.target}) within {self._timeout_s:g} s; it is "
                "stored on the master and may still be delivered: resend only with an "
                "idempotency key"
            )
        )

    def fail_waiting(self, error: BaseException) -> None:
        """Answer every write still waiting with ``error`` (the broker stopped being master)."""
        self._open = None
        while self._batches:
            b = self._batches.popleft()
            if b.timer is not None:
                b.timer.cancel()
            if not b.fut.done():
                b.fut.set_exception(error)

    # --- reports ---------------------------------------------------------------------------

    def report(self, replica: str, flushed: int) -> None:
        """A slave's fetch said its log is flushed below ``flushed``."""
        self.replicas[replica] = flushed
        self.seen_s[replica] = time.monotonic()
        self._open = None  # later writes wait for the next round
        if len(self.replicas) < self.min_insync:
            return
        covered = sorted(self.replicas.values(), reverse=True)[self.min_insync - 1]
        if covered <= self.covered:
            return
        self.covered = covered
        batches = self._batches
        while batches and (batches[0].fut.done() or batches[0].target <= covered):
            b = batches.popleft()
            if b.timer is not None:
                b.timer.cancel()
            if not b.fut.done():
                b.fut.set_result(None)

    def status(self) -> list[dict[str, Any]]:
        """Each slave's flushed offset and lag in bytes behind the master's flushed log."""
        flushed = self._store.flushed_offset
        now = time.monotonic()
        return [
            {
                "replica": name,
                "flushed_offset": off,
                "lag_bytes": max(flushed - off, 0),
                "seen_s_ago": round(now - self.seen_s.get(name, now), 3),
            }
            for name, off in sorted(self.replicas.items())
        ]


class _FlushSignal:
    """Wakes held fetches when the master's flushed offset moves (GroupCommitter.on_flushed)."""

    def __init__(self, store: MessageStore) -> None:
        self._store = store
        self._fut: asyncio.Future[None] | None = None
        store.committer.on_flushed = self._fire

    def _fire(self, _flushed: int) -> None:
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait_past(self, offset: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._store.flushed_offset <= offset:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._fut is None:
                self._fut = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._fut,), timeout=left)  # never cancels the shared future


def fetch_handler(
    store: MessageStore,
    tracker: ReplicaTracker,
    epochs: EpochHistory | None = None,
    offsets: Callable[[], dict[str, dict[str, dict[int, int]]]] | None = None,
) -> Handler:
    """The master's REPL_FETCH: record the slave's report, hold the request until the log is
    flushed past ``from_offset`` (at most ``wait_ms``), answer with whole flushed records.
    With an epoch history (elected masters), first tell a slave whose log runs past where its
    last epoch ended here to cut it there (epochs.py)."""
    signal: _FlushSignal | None = None

    async def repl_fetch(req: ReplFetchRequest) -> ReplFetchResponse:
        nonlocal signal
        history = epochs.entries if epochs is not None else []
        if history:
            end = epochs.end_of(req.last_epoch) if epochs is not None else None
            if end is not None and req.from_offset > end:
                log.warning(
                    "replica %s: its log ends at %d, past the end of its epoch %d here (%d): "
                    "told to cut its divergent tail",
                    req.replica,
                    req.from_offset,
                    req.last_epoch,
                    end,
                )
                return ReplFetchResponse(
                    req.from_offset,
                    b"",
                    req.from_offset,
                    store.flushed_offset,
                    list(history),
                    truncate_to=end,
                )
        tracker.report(req.replica, req.flushed_offset)
        wait_ms = min(max(req.wait_ms, 0), MAX_FETCH_WAIT_MS)
        if req.from_offset >= store.flushed_offset and wait_ms:
            if signal is None:
                signal = _FlushSignal(store)  # installed with the first slave only
            await signal.wait_past(req.from_offset, wait_ms / 1000)
        max_bytes = min(max(req.max_bytes, 1), MAX_FETCH_BYTES)
        data, nxt = store.read_replicated(req.from_offset, max_bytes)
        return ReplFetchResponse(
            req.from_offset,
            data,
            nxt,
            store.flushed_offset,
            list(history),
            offsets=offsets() if req.with_offsets and offsets is not None else None,
            master_covered=tracker.covered,
        )

    return repl_fetch


def refuse_writes(
    handlers: dict[int, Handler], direct: dict[int, DirectHandler], master: str
) -> None:
    """A slave: every request in ``WRITES`` is answered ``NOT_MASTER`` naming the master."""

    async def refuse(_: object) -> None:
        raise NotMaster(
            f"this broker is a slave of {master}: writes and offset commits go to the master"
        )

    for op in WRITES:
        handlers[op] = refuse
        direct.pop(op, None)


def install(
    settings: ReplicationSettings,
    store: MessageStore,
    handlers: dict[int, Handler],
    direct: dict[int, DirectHandler],
    offsets: Callable[[], dict[str, dict[str, dict[int, int]]]] | None = None,
) -> ReplicaTracker | None:
    """Wire replication into a starting broker: a master serves REPL_FETCH (and with sync
    replication gates its writes on the tracker); a slave refuses writes. Returns the tracker
    (None on a slave)."""
    if settings.replica_of is not None:
        refuse_writes(handlers, direct, settings.replica_of)
        return None
    tracker = ReplicaTracker(store, settings.min_insync, settings.timeout_ms / 1000)
    handlers[Opcode.REPL_FETCH] = fetch_handler(store, tracker, offsets=offsets)
    if settings.mode == "sync":
        store.replication_gate = tracker
        log.info(
            "replication: sync, a write is answered once %d slave(s) flushed it (at most %d ms)",
            settings.min_insync,
            settings.timeout_ms,
        )
    return tracker
