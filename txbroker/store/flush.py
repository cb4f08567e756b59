"""When appended records are durable: the group commit, the replication gate, the cut.

``GroupCommitter``: at most one fdatasync in flight, run by the syncer process (``syncer.py``);
appends that arrive meanwhile share the next one. ``Flusher`` is the store's one durability
wait over it (and over the ``ReplicationGate`` sync replication installs), and records where a
failed write cut the log. A failed write or fdatasync poisons the store (``StoreFailed``).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import errno as errno_mod
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from txbroker.errors import StoreFailed
from txbroker.store import syncer
from txbroker.store.checkpoint import TailCut
from txbroker.store.commitlog import CommitLog
from txbroker.store.state import Lifecycle

__all__ = ["MAX_GROUPS_IN_FLIGHT", "Flusher", "GroupCommitter", "ReplicationGate"]

log = logging.getLogger(__name__)


# Two groups in flight: while the syncer runs one fdatasync, the next group's request already
# waits in its pipe, so it starts the next fdatasync the moment the first ends instead of after
# a round trip through the (busy) event loop. More than two adds latency and no throughput: the
# syncer merges whatever requests it reads at once into one fdatasync anyway.
MAX_GROUPS_IN_FLIGHT = 2


@dataclass(slots=True)
class _Group:
    target: int  # log offset this group makes durable
    records: int  # the log's record counter at the start (statistics)
    waiters: list[asyncio.Future[None]]
    seqs: set[int] = field(default_factory=set)
    error: str | None = None
    t_start: float = 0.0


class GroupCommitter:
    def __init__(self, loop: asyncio.AbstractEventLoop, commitlog: CommitLog) -> None:
        self._loop = loop
        self._log = commitlog
        self.flushed = commitlog.write_pos  # every byte before this is durable
        self._waiters: list[asyncio.Future[None]] = []
        self._shared: asyncio.Future[None] | None = None  # durable_together()'s, until a start
        self._groups: collections.deque[_Group] = collections.deque()
        self._scheduled = False
        self._seq = 0
        self._requested = commitlog.write_pos  # end of the newest group sent
        self.failure: StoreFailed | None = None
        # Called once, when the first failure is set (the store records where to cut the log).
        self.on_failure: Callable[[], None] = lambda: None
        # Called with the new flushed offset after each group (replication's long-polled
        # fetches wake on it); None unless a slave has asked, so no call is made otherwise.
        self.on_flushed: Callable[[int], None] | None = None
        # Statistics for benchmarks and metrics.
        self.fsync_count = 0
        self.fsync_records = 0
        self._records_flushed = commitlog.records
        self.fsync_seconds: list[float] = []
        self._idle = asyncio.Event()
        self._idle.set()
        # Checkpoints and other durable side work run in this thread, never on the loop.
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "txb-durable")
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", syncer.__file__, str(commitlog.dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
            close_fds=True,
            # Its own session: a Ctrl-C or a SIGTERM sent to the broker's process group must not
            # kill the syncer before the broker's graceful shutdown has flushed through it.
            start_new_session=True,
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._wfd = self._proc.stdin.fileno()
        self._rfd = self._proc.stdout.fileno()
        os.set_blocking(self._rfd, False)
        self._rbuf = b""
        loop.add_reader(self._rfd, self._on_readable)

    def wait_durable(self) -> asyncio.Future[None]:
        """A future resolved once an fdatasync covers everything appended so far."""
        fut: asyncio.Future[None] = self._loop.create_future()
        self._wait(fut)
        return fut

    def durable_together(self) -> asyncio.Future[None]:
        """Like :meth:`wait_durable`, but one future for every caller until the next group
        starts: the hot paths add a callback to it instead of making a future each (a send's
        answer waits on it). Never await it from a task that may be cancelled, nor cancel it:
        the other callers share it."""
        fut = self._shared
        if fut is None or fut.done():
            fut = self._shared = self._loop.create_future()
            # Shared from before it waits: if waiting starts a group at once, that start takes
            # it (and forgets it), so no later append can ride on a group that began before it.
            self._wait(fut)
        return fut

    def _wait(self, fut: asyncio.Future[None]) -> None:
        if self.failure is not None:
            fut.set_exception(self.failure)
            return
        self._waiters.append(fut)
        if not self._groups:
            self._start()  # idle: sync at once, latency matters more than batching here
        elif len(self._groups) < MAX_GROUPS_IN_FLIGHT and not self._scheduled:
            # Busy: start the next group at the end of this loop turn, so every append made in
            # this turn (the tasks the last fsync woke) shares it.
            self._scheduled = True
            self._loop.call_soon(self._start)

    def request_flush(self) -> None:
        """Flush what is written without anyone waiting (async mode's interval flush)."""
        if not self._groups and self._log.write_pos > self.flushed:
            self._start()

    def _send(self, op: int, base: int) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        os.write(self._wfd, syncer.REQUEST.pack(op, self._seq, base))
        return self._seq

    def _start(self) -> None:
        self._scheduled = False
        if len(self._groups) >= MAX_GROUPS_IN_FLIGHT or self.failure is not None:
            return
        target = self._log.write_pos
        waiters, self._waiters = self._waiters, []
        self._shared = None  # taken with the waiters: later appends need the next group
        if target <= self._requested:
            # Nothing new since the newest group: these waiters ride on it (or on nothing).
            if self._groups:
                self._groups[-1].waiters.extend(waiters)
            else:
                for w in waiters:
                    if not w.done():
                        w.set_result(None)
            return
        group = _Group(target, self._log.records, waiters, t_start=time.perf_counter())
        start = self._requested
        self._requested = target
        self._groups.append(group)
        self._idle.clear()
        try:
            self._log.write_buffer()
            for seg in self._log.segments_between(start, target):
                group.seqs.add(self._send(syncer.OP_SYNC, seg.base))
        except OSError as e:
            self._fail(f"cannot write or sync the commit log: {e}")

    def forget(self, base: int) -> None:
        """Tell the syncer to close its descriptor of a segment about to be deleted."""
        if self.failure is None:
            try:
                self._send(syncer.OP_FORGET, base)
            except OSError as e:
                self._fail(f"the syncer process is gone: {e}")

    def _on_readable(self) -> None:
        try:
            data = os.read(self._rfd, 65536)
        except BlockingIOError:
            return
        if not data:
            self._fail("the syncer process exited unexpectedly")
            return
        buf = self._rbuf + data
        n = len(buf) // syncer.RESPONSE.size
        for i in range(n):
            seq, status, err = syncer.RESPONSE.unpack_from(buf, i * syncer.RESPONSE.size)
            for g in self._groups:
                if seq in g.seqs:
                    g.seqs.discard(seq)
                    if status:
                        g.error = f"fdatasync failed: {errno_mod.errorcode.get(err, err)}"
                    break
        self._rbuf = buf[n * syncer.RESPONSE.size :]
        # Groups finish in order: the syncer answers requests in the order it read them.
        while self._groups and not self._groups[0].seqs:
            self._done(self._groups.popleft())
            if self.failure is not None:
                return
        if self._waiters and len(self._groups) < MAX_GROUPS_IN_FLIGHT and not self._scheduled:
            self._start()
        if not self._groups:
            self._idle.set()

    def _done(self, group: _Group) -> None:
        if group.error is not None:
            self._fail(group.error, group.waiters)
            return
        self.flushed = max(self.flushed, group.target)
        self.fsync_count += 1
        self.fsync_records += max(group.records - self._records_flushed, 0)
        self._records_flushed = group.records
        if len(self.fsync_seconds) < 1_000_000:
            self.fsync_seconds.append(time.perf_counter() - group.t_start)
        for w in group.waiters:
            if not w.done():
                w.set_result(None)
        if self.on_flushed is not None:
            self.on_flushed(self.flushed)

    def poison(self, failure: StoreFailed) -> None:
        """Fail every waiter and refuse further syncs (the store hit an unrecoverable error)."""
        if self.failure is None:
            self.failure = failure
            log.error("%s", failure)
            self._failed_first()
        self._fail(str(failure))

    def _failed_first(self) -> None:
        try:
            self.on_failure()
        except Exception:  # the failure stands whatever its bookkeeping does
            log.exception("recording the store's failure failed")

    def _fail(self, why: str, waiters: list[asyncio.Future[None]] | None = None) -> None:
        if self.failure is None:
            self.failure = StoreFailed(f"{why}; the store stops accepting writes")
            log.error("%s", self.failure)
            self._failed_first()
        pending = list(waiters or []) + self._waiters
        for g in self._groups:
            pending.extend(g.waiters)
        self._groups.clear()
        self._waiters = []
        self._shared = None
        for w in pending:
            if not w.done():
                w.set_exception(self.failure)
        self._idle.set()

    async def drain(self) -> None:
        """Wait until everything written so far is flushed (or the store has failed)."""
        while self.failure is None and (self._groups or self._log.write_pos > self.flushed):
            if not self._groups:
                self._start()
            await self._idle.wait()

    def run_in_durable_thread(self, fn: Callable[[], None]) -> asyncio.Future[None]:
        return asyncio.wrap_future(self._pool.submit(fn), loop=self._loop)

    def close(self) -> None:
        self._loop.remove_reader(self._rfd)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - the child only loops on read
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._pool.shutdown(wait=True)


class ReplicationGate(Protocol):
    """What a write waits for when replication is synchronous (installed on the master by
    ``txbroker.server.replication``)."""

    covered: int  # the log is flushed on enough replicas below this: consumers read below it

    def covering(self, offset: int) -> asyncio.Future[None]:
        """A future resolved once enough replicas have flushed the log up to ``offset``
        (which implies the master flushed it: replicas only receive flushed bytes), or failed
        with a ``ReplicationTimeout``. Shared by many callers: never cancel it."""
        ...


class Flusher:
    """The store's durability: one wait for "everything appended so far is durable" (the
    group commit in sync flush mode, the replication gate when one is installed), what
    consumers may read, and where a failed write cut the log."""

    def __init__(
        self, commitlog: CommitLog, sync: bool, tail_cut: TailCut, lifecycle: Lifecycle
    ) -> None:
        self.log = commitlog
        self.sync = sync
        self._tail_cut = tail_cut
        self._lifecycle = lifecycle
        self.committer: GroupCommitter | None = None  # started once the store is recovered
        self.gate: ReplicationGate | None = None  # set by sync replication
        self.cut_at: int | None = None  # where a failed write cut the log (TailCut)

    def start(self, loop: asyncio.AbstractEventLoop) -> GroupCommitter:
        committer = self.committer = GroupCommitter(loop, self.log)
        committer.on_failure = self._on_commit_failure
        return committer

    def durable(self, *, own: bool = True) -> asyncio.Future[None] | None:
        """The store's one durability wait: a future resolved once everything appended so far
        is durable (flushed in sync mode; with a gate, held by enough replicas), or None when
        nothing is waited for (async mode, no gate). ``own``: a future for this caller alone,
        which it may cancel (what an append awaits); else one shared by every caller until the
        next group commit starts: add callbacks to it, never cancel it. An own future of the
        group commit is resolved by the group itself, not through the shared one: awaiting a
        shielded shared future costs every append an extra loop callback."""
        gate = self.gate
        if gate is not None:
            shared = gate.covering(self.log.write_pos)
            return asyncio.shield(shared) if own else shared
        if not self.sync:
            return None
        assert self.committer is not None
        return self.committer.wait_durable() if own else self.committer.durable_together()

    @property
    def flushed(self) -> int:
        return self.committer.flushed if self.committer is not None else 0

    @property
    def readable_offset(self) -> int:
        """Consumers see records below this: in sync mode only durable ones (and, with a gate,
        only those enough replicas hold), so no consumer acts on a record a power loss or a
        failover could still take back; in async mode all. Never past the cut."""
        end = self.flushed if self.sync else self.log.write_pos
        gate = self.gate
        if gate is not None:
            end = min(end, gate.covered)
        return end if self.cut_at is None else min(end, self.cut_at)

    @property
    def end(self) -> int:
        """The end of what was written and not cut off by a failed write."""
        end = self.log.write_pos
        return end if self.cut_at is None else min(end, self.cut_at)

    def fail_write(self, e: BaseException, first: int) -> NoReturn:
        """A write the reservation made safe failed all the same (an I/O error): part of the
        batch may be in the log and not in its queue, which cannot be undone safely in place.
        Stop appending, and cut the log durably where nothing after was acknowledged, so no
        restart delivers what the client was told failed: in sync flush mode from the flushed
        offset (nothing past it was acknowledged), else from the batch's first record."""
        failure = e if isinstance(e, StoreFailed) else StoreFailed(f"append failed: {e}")
        if failure is not e:
            failure.__cause__ = e
        assert self.committer is not None
        self.cut(self.committer.flushed if self.sync else first)
        self.committer.poison(failure)  # calls _on_commit_failure: the store is FAILED
        self._lifecycle.fail(failure)  # if the committer had failed already
        raise failure from None

    def _on_commit_failure(self) -> None:
        """The group committer failed (a write or an fdatasync of the log, or the syncer
        died), or a write did: in sync mode nothing past the flushed offset was acknowledged,
        so cut the log there; and the store is FAILED from now on, not at its next append, so
        nothing (a close, a checkpoint) treats it as healthy."""
        assert self.committer is not None and self.committer.failure is not None
        if self.sync:
            self.cut(self.committer.flushed)
        self._lifecycle.fail(self.committer.failure)

    def cut(self, offset: int) -> None:
        """Record durably that the log ends at ``offset`` (see ``TailCut``); the first cut of
        a run stands. If even that write fails, the disk is gone and recovery keeps what it
        finds (logged loudly)."""
        if self.cut_at is not None:
            return
        self.cut_at = offset  # from now on nothing from there is read, counted or found
        try:
            self._tail_cut.write(offset)
        except OSError:
            log.exception(
                "cannot record where the failed write cut the log (offset %d): records after "
                "it that clients were told failed may come back at the next start",
                offset,
            )
