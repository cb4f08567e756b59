"""Failover: a ``--role auto`` broker moves between slave and master as its group elects.

Membership (membership.py) campaigns and tells this module: ``follow(master)`` (replicate it;
a log that runs past the master's history is cut at a restart, its tail kept in
``<data>/divergent/``), ``promote(epoch)`` (begin the epoch at the end of the log, rebuild the
transactions, take the master's duties) or ``step_down()`` (refuse writes at once, stop the
duties after). Nothing is truncated on promotion: what the new master holds was flushed on
the old one first. The states and their moves are ``_TRANSITIONS``, taken by one guarded
function (``Failover._move``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Final

from txbroker.cluster.routes import BrokerInfo
from txbroker.errors import NotMaster, ReplicationTimeout
from txbroker.protocol.frames import Opcode
from txbroker.server.delay import DelayScheduler
from txbroker.server.replication.epochs import EpochHistory
from txbroker.server.replication.master import ReplicationMaster
from txbroker.server.replication.slave import Replicator
from txbroker.server.role import MASTER_ONLY, Role
from txbroker.store import MessageStore
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import TxCoordinator
from txbroker.tx.halfcopy import HalfCopier

__all__ = ["DIVERGENT_DIR", "Failover", "FailoverState", "MasterDuties"]

log = logging.getLogger(__name__)

DIVERGENT_DIR: Final = "divergent"
_COPY_BYTES: Final = 4 << 20


class FailoverState(enum.Enum):
    WAITING = "waiting"  # a slave with no master to follow
    FOLLOWING = "following"
    PROMOTING = "promoting"
    MASTER = "master"
    RESTARTING = "restarting"  # its log diverged: the tail is cut at the restart


#     WAITING ◀──────────▶ FOLLOWING ──diverged──▶ RESTARTING
#        │ ▲                   │
#        │ └──step_down()──┐   │ promote()
#        └──promote()──▶ PROMOTING ──▶ MASTER
_TRANSITIONS: Final = {
    FailoverState.WAITING: frozenset({FailoverState.FOLLOWING, FailoverState.PROMOTING}),
    FailoverState.FOLLOWING: frozenset(
        {FailoverState.WAITING, FailoverState.FOLLOWING, FailoverState.PROMOTING}
        | {FailoverState.RESTARTING}
    ),
    FailoverState.PROMOTING: frozenset({FailoverState.MASTER, FailoverState.WAITING}),
    FailoverState.MASTER: frozenset({FailoverState.WAITING}),
    FailoverState.RESTARTING: frozenset(),
}


class MasterDuties:
    """What only a master does, taken on and dropped as a whole."""

    def __init__(
        self,
        store: MessageStore,
        tx: TxCoordinator,
        checker: BackChecker,
        scheduler: DelayScheduler,
        halves: HalfCopier,
        role: Role,
        slaves: ReplicationMaster,
        epochs: EpochHistory,
    ) -> None:
        self.store = store
        self._tx = tx
        self._checker = checker
        self._scheduler = scheduler
        self._halves = halves
        self._role = role
        self.slaves = slaves
        self.epochs = epochs
        self.active = False

    def refuse(self, why: str, master: str | None = None) -> None:
        """Refuse every write (and REPL_FETCH) now, naming ``why`` (and ``master``, the one to
        ask, when known); synchronous. Writes still waiting for their slaves are answered now:
        their outcome is unknown."""
        where = f"its master is {master}" if master else "ask the NameServer for the master"
        self._role.refuse(
            MASTER_ONLY, f"this broker is not its group's master now ({why}): {where}"
        )
        self.store.follow(master or "the master its group elects")
        self.store.replication_gate = None
        self.store.retention_hook = None
        tracker = self.slaves.tracker
        if tracker is not None:
            tracker.fail_waiting(
                ReplicationTimeout(
                    f"this broker stopped being master ({why}) before enough slaves had the "
                    "write: it may still be delivered; resend only with an idempotency key"
                )
            )

    async def take(
        self,
        epoch: int,
        is_leader: Callable[[], bool],
        on_lapsed: Callable[[], None],
        covered: int = 0,
    ) -> None:
        """Become master of ``epoch``. Every append first asks ``is_leader()`` (the lease
        still surely alive); if not, ``on_lapsed()`` steps down and the append is refused.
        ``covered``: the log below it is on enough slaves (as the last master said); its
        consumers read beyond it only once this term's slaves hold it."""
        store = self.store
        await store.committer.wait_durable()  # what the last fetch wrote, before the epoch
        self.epochs.begin(epoch, store.write_offset)

        def fence() -> None:
            if not is_leader():
                on_lapsed()
                raise NotMaster(
                    "this broker's term as master lapsed (its lease could not be renewed in "
                    "time): ask the NameServer for the group's master"
                )

        store.unfollow(fence)
        store.retention_hook = self._halves
        # What the last master said its slaves held: readable at once. The rest of the log
        # may be on this broker alone; a consumer acting on it before a slave holds it could
        # act on a record the next failover takes back.
        covered = min(covered, store.write_offset)
        self.slaves.begin(covered=covered, term_valid=is_leader)
        # Slaves may fetch at once; producers wait until the transactions are rebuilt (an
        # END_TX for one not yet recovered would be refused as unknown).
        self._role.serve(frozenset({Opcode.REPL_FETCH}))
        started = time.monotonic()
        await self._tx.recover(from_start=True, covered=covered)
        self._halves.start(self._tx)
        self._checker.start()
        self._scheduler.forget_cursors()
        self._scheduler.start()
        if not is_leader():  # lost while taking over: the caller unwinds (no await from here)
            raise NotMaster("the term ended while this broker was taking over")
        self.slaves.gate()
        self._role.serve_all()
        self.active = True
        log.warning(
            "master duties taken in %.2f s: epoch %d from log offset %d, %d open transactions",
            time.monotonic() - started,
            epoch,
            store.write_offset,
            len(self._tx.open),
        )

    async def drop(self) -> None:
        """Stop the duties' tasks (writes were refused already, :meth:`refuse`); also those
        of a take-over that did not finish."""
        self.active = False
        await self._checker.stop()
        await self._scheduler.stop()


class Failover:
    """The role of one ``--role auto`` broker (see the module docstring)."""

    def __init__(
        self,
        duties: MasterDuties,
        replicator_for: Callable[[str], Replicator],
        data_dir: Path,
        on_restart: Callable[[str], None],
    ) -> None:
        self.duties = duties
        self._replicator_for = replicator_for
        self._data_dir = data_dir
        self._on_restart = on_restart
        self.state = FailoverState.WAITING
        self.master: str | None = None  # the address followed
        self.replicator: Replicator | None = None
        self.heard_covered = 0  # the last master's covered offset, as its last answer said
        self._lock = asyncio.Lock()  # one switch at a time, in the order asked
        self._tasks: set[asyncio.Task[None]] = set()

    def _move(self, to: FailoverState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise AssertionError(f"failover: {self.state.name} -> {to.name}")
        log.info("failover: %s -> %s", self.state.value, to.value)
        self.state = to

    def start(self) -> None:
        self.duties.refuse("no master elected yet")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("failover: %s", task.exception(), exc_info=task.exception())

    # Told by Membership.

    def on_master(self, info: BrokerInfo | None) -> None:
        """The group's master is now ``info`` (another broker), or none."""
        self._spawn(self._follow(info.address if info is not None else None))

    async def _follow(self, address: str | None) -> None:
        async with self._lock:
            if self.state not in (FailoverState.WAITING, FailoverState.FOLLOWING):
                return  # leading (its own key), or restarting
            if address == self.master:
                return
            await self._stop_replicator()
            self.master = address
            if address is None:
                self._move(FailoverState.WAITING)
                self.duties.refuse("no master elected now")
                return
            self._move(FailoverState.FOLLOWING)
            self.duties.refuse(f"a slave of {address}", address)
            self.replicator = self._replicator_for(address)
            self.replicator.start()

    async def promote(self, epoch: int, is_leader: Callable[[], bool]) -> None:
        """Won the election of ``epoch``: become master (raises if it cannot; the caller
        resigns). ``is_leader`` fences every append of the term."""
        async with self._lock:
            self._move(FailoverState.PROMOTING)
            await self._stop_replicator()
            self.master = None
            try:
                await self.duties.take(epoch, is_leader, self.step_down, self.heard_covered)
            except BaseException:
                self.duties.refuse("taking over failed")
                await self.duties.drop()
                self._move(FailoverState.WAITING)
                raise
            self._move(FailoverState.MASTER)

    def step_down(self) -> None:
        """Leadership lost: refuse writes now (synchronously), stop the duties after. While
        taking over, :meth:`promote` notices (``take`` checks the term last) and unwinds."""
        if self.state not in (FailoverState.MASTER, FailoverState.PROMOTING):
            return
        self.duties.refuse("stepped down as master")
        if self.state is FailoverState.MASTER:
            self._move(FailoverState.WAITING)
            self._spawn(self.duties.drop())

    def diverged(self, cut_at: int, epochs: list[tuple[int, int]]) -> None:
        """The master says this log runs past its history at ``cut_at``."""
        if self.state is not FailoverState.FOLLOWING:
            return
        self._move(FailoverState.RESTARTING)
        store = self.duties.store
        kept = save_divergent(store, cut_at, self._data_dir / DIVERGENT_DIR)
        store.cut_tail(cut_at)
        self.duties.epochs.adopt(epochs)
        self._on_restart(
            f"its log runs past the master's history at offset {cut_at} "
            f"({store.write_offset - cut_at} bytes, kept in {kept}): restarting to cut it"
        )

    async def _stop_replicator(self) -> None:
        r, self.replicator = self.replicator, None
        if r is not None:
            await r.stop()
            if r.fetches:
                self.heard_covered = r.master_covered

    async def stop(self) -> None:
        await self._stop_replicator()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.duties.active:
            await self.duties.drop()


def save_divergent(store: MessageStore, cut_at: int, folder: Path) -> Path:
    """Copy the log's bytes from ``cut_at`` to its end into a folder of ``folder``: one file
    per read, named by the log offset it starts at (whole records as the log holds them, a
    segment's end marker last: ``txbroker.store.replication.parse_records`` reads each back)."""
    kept = folder / f"{cut_at:020d}-{time.strftime('%Y%m%dT%H%M%S')}"
    kept.mkdir(parents=True, exist_ok=True)
    end = store.write_offset
    pos = cut_at
    while pos < end:
        data, nxt = store.log.read_raw(pos, end, _COPY_BYTES)
        (kept / f"{pos:020d}.log").write_bytes(data)
        if nxt <= pos:
            break
        pos = nxt
    log.warning("divergent tail [%d, %d) kept in %s", cut_at, end, kept)
    return kept
