"""Group commit: one fdatasync makes every record appended before it durable.

At most one fdatasync is in flight, run by the syncer process (see ``syncer.py`` for why a
process). Appends that arrive while it runs wait together for the next one, so under load one
fsync covers many records and appending (this core) overlaps with syncing (the other core).

A failed fdatasync poisons the store (see :class:`~txbroker.errors.StoreFailed`): its waiters
and every later append get the error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno as errno_mod
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable

from txbroker.errors import StoreFailed
from txbroker.store import syncer
from txbroker.store.commitlog import CommitLog

__all__ = ["GroupCommitter"]

log = logging.getLogger(__name__)


class GroupCommitter:
    def __init__(self, loop: asyncio.AbstractEventLoop, commitlog: CommitLog) -> None:
        self._loop = loop
        self._log = commitlog
        self.flushed = commitlog.write_pos  # every byte before this is durable
        self._waiters: list[asyncio.Future[None]] = []
        self._inflight_waiters: list[asyncio.Future[None]] = []
        self._inflight_target = 0
        self._inflight_records = 0
        self._records_flushed = 0
        self._inflight_seqs: set[int] = set()
        self._inflight_error: str | None = None
        self._group_open = False  # a group of syncs is in flight
        self._t_start = 0.0
        self._seq = 0
        self.failure: StoreFailed | None = None
        # Statistics for benchmarks and metrics.
        self.fsync_count = 0
        self.fsync_records = 0
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
        if self.failure is not None:
            fut.set_exception(self.failure)
            return fut
        self._waiters.append(fut)
        if not self._group_open:
            # Start at once: appends that arrive while this fsync runs form the next group, so
            # appending (CPU, this process) overlaps with syncing (disk, the syncer).
            self._start()
        return fut

    def request_flush(self) -> None:
        """Flush what is written without anyone waiting (async mode's interval flush)."""
        if not self._group_open and self._log.write_pos > self.flushed:
            self._start()

    def _send(self, op: int, base: int) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        os.write(self._wfd, syncer.REQUEST.pack(op, self._seq, base))
        return self._seq

    def _start(self) -> None:
        if self._group_open or self.failure is not None:
            return
        target = self._log.write_pos
        waiters, self._waiters = self._waiters, []
        if target <= self.flushed:
            self._records_flushed = self._log.records
            for w in waiters:
                if not w.done():
                    w.set_result(None)
            return
        self._inflight_target = target
        self._inflight_records = self._log.records
        self._inflight_waiters = waiters
        self._inflight_error = None
        self._idle.clear()
        self._group_open = True
        self._t_start = time.perf_counter()
        try:
            self._log.write_buffer()
            for seg in self._log.segments_between(self.flushed, target):
                self._inflight_seqs.add(self._send(syncer.OP_SYNC, seg.base))
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
            if seq in self._inflight_seqs:
                self._inflight_seqs.discard(seq)
                if status:
                    self._inflight_error = f"fdatasync failed: {errno_mod.errorcode.get(err, err)}"
        self._rbuf = buf[n * syncer.RESPONSE.size :]
        if self._group_open and not self._inflight_seqs:
            self._group_open = False
            self._done()

    def _done(self) -> None:
        waiters, self._inflight_waiters = self._inflight_waiters, []
        if self._inflight_error is not None:
            self._fail(self._inflight_error, waiters)
            return
        self.flushed = max(self.flushed, self._inflight_target)
        self.fsync_count += 1
        self.fsync_records += self._inflight_records - self._records_flushed
        self._records_flushed = self._inflight_records
        if len(self.fsync_seconds) < 1_000_000:
            self.fsync_seconds.append(time.perf_counter() - self._t_start)
        for w in waiters:
            if not w.done():
                w.set_result(None)
        if self._waiters:
            self._start()
        if not self._group_open:
            self._idle.set()

    def poison(self, failure: StoreFailed) -> None:
        """Fail every waiter and refuse further syncs (the store hit an unrecoverable error)."""
        if self.failure is None:
            self.failure = failure
            log.error("%s", failure)
        self._fail(str(failure))

    def _fail(self, why: str, waiters: list[asyncio.Future[None]] | None = None) -> None:
        if self.failure is None:
            self.failure = StoreFailed(f"{why}; the store stops accepting writes")
            log.error("%s", self.failure)
        pending = (waiters or []) + self._inflight_waiters + self._waiters
        self._inflight_waiters, self._waiters = [], []
        self._inflight_seqs.clear()
        self._group_open = False
        for w in pending:
            if not w.done():
                w.set_exception(self.failure)
        self._idle.set()

    async def drain(self) -> None:
        """Wait until everything written so far is flushed (or the store has failed)."""
        while self.failure is None and (self._group_open or self._log.write_pos > self.flushed):
            if not self._group_open:
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
