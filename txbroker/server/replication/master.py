"""The master's side of replication: REPL_FETCH and its slaves' flushed offsets.

A slave fetches from the end of its log and reports its flushed offset; the master answers
from its flushed log only, so a slave never holds a record the master could lose. With
``--replication sync --min-insync N`` the :class:`ReplicaTracker` is the store's replication
gate: a write's answer waits until N slaves reported the log flushed past it, or fails with
``REPLICATION_TIMEOUT``. With ``async`` writes are answered after the master's own flush.

Topics are not in the log: each answer carries the master's topics version, and the slave
copies the topics before writing the answer's records when it copied another version last;
such an answer also carries the fences of the deleted topics, which the slave deletes too.
With sync replication a topic creation or deletion is answered, as a write is, once N slaves
said (in a fetch) that they hold the new version.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from txbroker.errors import NotMaster, ReplicationTimeout
from txbroker.protocol.messages import DeletedTopic, ReplFetchRequest, ReplFetchResponse
from txbroker.server.connection import Deferred, later
from txbroker.server.replication import ReplicationSettings
from txbroker.server.replication.epochs import EpochHistory
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore

__all__ = ["MAX_FETCH_BYTES", "ReplicaTracker", "ReplicationMaster"]

log = logging.getLogger(__name__)

# A fetch answer is one frame (16 MiB at most, frames.MAX_FRAME_BYTES); 8 MiB leaves room for
# one whole record of the largest size (4 MiB body + 32 KiB properties) past the bound.
MAX_FETCH_BYTES: Final = 8 << 20
# A fetch with nothing new is held at most this long: bounded like a consumer's long poll, short
# enough that a slave's report of its flushed offset is never older than this when idle.
MAX_FETCH_WAIT_MS: Final = 30_000


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
        term_valid: Callable[[], bool] | None = None,
        on_late_cover: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        # Called when the slaves come to hold writes whose wait for them timed out: those
        # records stand in the log and consumers may read them now, but no append wakes their
        # queues' long polls then (their group commit's wake-up failed with the timeout).
        self._on_late_cover = on_late_cover
        self._timed_out_below = 0  # the end of the writes whose wait timed out, still uncovered
        # An elected master's lease check (election.py's is_leader): once it may have ended on
        # etcd a successor may be chosen by reports written from then on, so a write covered
        # only later must not be answered as acknowledged (the step-down fails it instead).
        self._term_valid = term_valid
        self._loop = asyncio.get_running_loop()
        self.min_insync = min_insync
        self._timeout_s = timeout_s
        self.replicas: dict[str, int] = {}  # slave name -> flushed offset it reported
        self.topics_versions: dict[str, int] = {}  # slave name -> topics version it holds
        self.seen_s: dict[str, float] = {}  # slave name -> monotonic time of its last report
        # The log is flushed on min_insync slaves below this; consumers read below it too. What
        # the log held when the tracker was made counts as covered (an elected master's term
        # begins with it; a master's log before this run is what it was).
        self.covered = store.flushed_offset if covered is None else covered
        self._batches: collections.deque[_Batch] = collections.deque()
        self._open: _Batch | None = None
        self._topic_waits: list[_Batch] = []  # target: a topics version (rare: no batching)
        self.timeouts = 0

    # --- the gate (txbroker.store.flush.ReplicationGate) --------------------------------

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
        self._timed_out_below = max(self._timed_out_below, b.target)
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

    def topics_covering(self, version: int) -> asyncio.Future[None]:
        """A future resolved once ``min_insync`` slaves said they hold the master's topics as
        of ``version`` (``TopicRegistry.version``), or failed as a write's is (the same
        timeout). The caller's own: it may cancel it."""
        fut = self._loop.create_future()
        if self._topics_covered() >= version:
            fut.set_result(None)
            return fut
        w = _Batch(version, fut)
        w.timer = self._loop.call_at(self._loop.time() + self._timeout_s, self._expire_topics, w)
        self._topic_waits.append(w)
        return fut

    def _topics_covered(self) -> int:
        versions = sorted(self.topics_versions.values(), reverse=True)
        return versions[self.min_insync - 1] if len(versions) >= self.min_insync else -1

    def _expire_topics(self, w: _Batch) -> None:
        if w in self._topic_waits:
            self._topic_waits.remove(w)
        if w.fut.done():
            return
        self.timeouts += 1
        insync = sum(1 for v in self.topics_versions.values() if v >= w.target)
        w.fut.set_exception(
            ReplicationTimeout(
                f"sync replication: {insync} of the {self.min_insync} slaves needed copied the "
                f"topics (version {w.target}) within {self._timeout_s:g} s; the change is made "
                "on the master and reaches the slaves when they fetch"
            )
        )

    def fail_waiting(self, error: BaseException) -> None:
        """Answer every write (and topic creation) still waiting with ``error`` (the broker
        stopped being master)."""
        self._open = None
        waits, self._topic_waits = self._topic_waits, []
        for w in waits:
            if w.timer is not None:
                w.timer.cancel()
            if not w.fut.done():
                w.fut.set_exception(error)
        while self._batches:
            b = self._batches.popleft()
            if b.timer is not None:
                b.timer.cancel()
            if not b.fut.done():
                b.fut.set_exception(error)

    # --- reports ---------------------------------------------------------------------------

    def report(self, replica: str, flushed: int, topics_version: int = -1) -> None:
        """A slave's fetch said its log is flushed below ``flushed`` and that it holds the
        master's topics as of ``topics_version`` (-1: it does not say)."""
        self.replicas[replica] = flushed
        self.topics_versions[replica] = topics_version
        self.seen_s[replica] = time.monotonic()
        if self._term_valid is not None and not self._term_valid():
            return
        if self._topic_waits:
            covered_version = self._topics_covered()
            for w in [w for w in self._topic_waits if w.target <= covered_version]:
                self._topic_waits.remove(w)
                if w.timer is not None:
                    w.timer.cancel()
                if not w.fut.done():
                    w.fut.set_result(None)
        self._open = None  # later writes wait for the next round
        if len(self.replicas) < self.min_insync:
            return
        covered = sorted(self.replicas.values(), reverse=True)[self.min_insync - 1]
        if covered <= self.covered:
            return
        late = self._timed_out_below > self.covered
        self.covered = covered
        if late:
            if covered >= self._timed_out_below:
                self._timed_out_below = 0
            if self._on_late_cover is not None:
                self._on_late_cover()
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


class _Signal:
    """Wakes held fetches when the master's flushed offset moves (GroupCommitter.on_flushed)
    or its topics change (TopicRegistry.on_change)."""

    def __init__(self, store: MessageStore, topics: TopicRegistry) -> None:
        self._store = store
        self._topics = topics
        self._fut: asyncio.Future[None] | None = None
        store.committer.on_flushed = self._fire
        topics.on_change = self._fire

    def _fire(self, _: int) -> None:
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def wait_past(self, offset: int, topics_version: int, timeout_s: float) -> None:
        """Until the log is flushed past ``offset`` or the topics version is no longer
        ``topics_version``, at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._store.flushed_offset <= offset and self._topics.version == topics_version:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self._fut is None:
                self._fut = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._fut,), timeout=left)  # never cancels the shared future


Offsets = Callable[[], dict[str, dict[str, dict[int, int]]]]


class ReplicationMaster:
    """What a master does for its slaves: answer REPL_FETCH (:meth:`handle`) and track them.

    A term begins with :meth:`begin` (a new tracker) and, with sync replication, :meth:`gate`
    (the store's writes wait for the slaves). With an epoch history (elected masters), a slave
    whose log runs past where its last epoch ended here is first told to cut it there."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        settings: ReplicationSettings,
        *,
        epochs: EpochHistory | None = None,
        offsets: Offsets | None = None,
        on_late_cover: Callable[[], None] | None = None,
    ) -> None:
        self._store = store
        self._on_late_cover = on_late_cover  # see ReplicaTracker
        self._topics = topics
        self._settings = settings
        self._epochs = epochs
        self._offsets = offsets
        self.tracker: ReplicaTracker | None = None  # the current term's
        self._signal: _Signal | None = None  # installed with the first slave only

    def begin(
        self, covered: int | None = None, term_valid: Callable[[], bool] | None = None
    ) -> ReplicaTracker:
        """A term as master: slaves are tracked from now (``covered``, ``term_valid``: see
        ReplicaTracker)."""
        s = self._settings
        self.tracker = ReplicaTracker(
            self._store,
            s.min_insync,
            s.timeout_ms / 1000,
            covered=covered,
            term_valid=term_valid,
            on_late_cover=self._on_late_cover,
        )
        return self.tracker

    def gate(self) -> None:
        """With sync replication, make every write's answer wait for the slaves."""
        if self._settings.mode != "sync":
            return
        self._store.replication_gate = self.tracker
        log.info(
            "replication: sync, a write is answered once %d slave(s) flushed it (at most %d ms)",
            self._settings.min_insync,
            self._settings.timeout_ms,
        )

    def topics_replicated(self) -> asyncio.Future[None] | None:
        """With sync replication, while this broker is master: a future resolved once enough
        slaves hold its topics as they are now (``ReplicaTracker.topics_covering``). None when
        a topic change is answered at once (async replication, or not master)."""
        tracker = self.tracker
        # The gate is installed exactly while this term's writes wait for the slaves.
        if tracker is None or self._store.replication_gate is not tracker:
            return None
        return tracker.topics_covering(self._topics.version)

    def handle(self, req: ReplFetchRequest) -> Deferred:
        """REPL_FETCH's handler: held until the log is flushed past ``from_offset`` (at most
        ``wait_ms``), answered with whole flushed records."""
        return later(self._fetch(req))

    async def _fetch(self, req: ReplFetchRequest) -> ReplFetchResponse:
        store, epochs, tracker = self._store, self._epochs, self.tracker
        if tracker is None:  # refused before it gets here (role.py): a term not begun
            raise NotMaster("this broker is not serving its slaves now")
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
        tracker.report(req.replica, req.flushed_offset, req.topics_version)
        wait_ms = min(max(req.wait_ms, 0), MAX_FETCH_WAIT_MS)
        version = self._topics.version
        # A slave that holds another version than this one is answered at once (it copies the
        # topics then); one that does not say (-1) is held as for the log alone.
        stale = 0 <= req.topics_version != version
        if req.from_offset >= store.flushed_offset and wait_ms and not stale:
            if self._signal is None:
                self._signal = _Signal(store, self._topics)
            await self._signal.wait_past(req.from_offset, version, wait_ms / 1000)
        max_bytes = min(max(req.max_bytes, 1), MAX_FETCH_BYTES)
        data, nxt = store.read_replicated(req.from_offset, max_bytes)
        offsets = self._offsets
        version = self._topics.version
        deleted = None
        if 0 <= req.topics_version != version:  # the slave copies the topics with this answer
            deleted = {
                name: DeletedTopic(f.phys, f.ends) for name, f in self._topics.fences.items()
            }
        return ReplFetchResponse(
            req.from_offset,
            data,
            nxt,
            store.flushed_offset,
            list(history),
            offsets=offsets() if req.with_offsets and offsets is not None else None,
            master_covered=tracker.covered,
            topics_version=version,
            deleted=deleted,
        )
