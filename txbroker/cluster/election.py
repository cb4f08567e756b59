"""Election of one leader per key ("the master of group g1"), on a key held under a kept lease.

A candidate campaigns by creating the election key under a lease of its own, only if the key is
absent; the others watch it and try again once it is deleted. The winner keeps its lease alive
(lease.py) and steps down before that lease can have expired on etcd, so a new leader never
overlaps with the old one. The key's create revision is the term's **epoch**, a fencing token.
:class:`Election` draws the states; :func:`watch_leader` follows the key from outside (the
NameServer, ``cluster status``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from txbroker.cluster._tasks import cancel_and_wait
from txbroker.cluster.coordination import Coordinator, EventKind, KeyValue, Lease
from txbroker.cluster.lease import LeaseKeeper
from txbroker.errors import CoordinationError, CoordinatorUnavailable

__all__ = ["DEFAULT_TTL_S", "Election", "ElectionState", "Term", "watch_leader"]

log = logging.getLogger(__name__)

# Failover's target is a new master within 5 s of the old one dying (docs/cluster.md): a dead
# master's key goes when its lease ends, so the TTL bounds the takeover; 3 s leaves 2 s for the
# new master to start.
DEFAULT_TTL_S: Final = 3
# Between attempts when etcd cannot be reached: often enough to win soon after it is back, not
# so often that a hundred brokers hammer a recovering etcd.
RETRY_INTERVAL_S: Final = 0.5
# A candidate that may not campaign yet (``eligible``) looks again this often while the key is
# vacant: the better one usually wins within a round trip, or the reports it waits for arrive.
ELIGIBILITY_RECHECK_S: Final = 0.2


class ElectionState(enum.Enum):
    IDLE = "idle"
    CAMPAIGNING = "campaigning"
    LEADER = "leader"
    STEPPED_DOWN = "stepped_down"
    RESIGNED = "resigned"


_TRANSITIONS: Final = {
    ElectionState.IDLE: frozenset({ElectionState.CAMPAIGNING}),
    ElectionState.CAMPAIGNING: frozenset({ElectionState.LEADER, ElectionState.IDLE}),
    ElectionState.LEADER: frozenset({ElectionState.STEPPED_DOWN, ElectionState.RESIGNED}),
    ElectionState.STEPPED_DOWN: frozenset({ElectionState.CAMPAIGNING}),
    ElectionState.RESIGNED: frozenset({ElectionState.CAMPAIGNING}),
}


@dataclass(frozen=True, slots=True)
class Term:
    """One leadership: the key as this candidate created it."""

    key: str
    value: bytes
    lease_id: int
    epoch: int  # the key's create revision: higher for every later term
    elected_at_s: float  # time.monotonic() when the campaign won


class Election:
    """One candidate for the leadership of ``key``, with ``value`` (who it is: the other
    candidates and :func:`watch_leader` read it).

    ::

        election = Election(coordinator, "/txb/groups/g1/master", b"b1", on_step_down=demote)
        term = await election.campaign()  # returns once this candidate leads
        ...
        if election.is_leader():  # before each act only the leader may do
            ...
        await election.resign()

    ``on_step_down(reason)`` is called (in the event loop, synchronously) the moment
    leadership is lost; ``stepped_down`` is set then too. ``eligible(vacant_since)``, if given,
    is asked each time the key is vacant: a candidate that may not lead now does not campaign
    (failover: only a slave sure to hold every acknowledged write may win). ``vacant_since`` is
    a revision at or after the one that deleted the key, the same for every ask of one vacancy:
    what was written after it was written after the last leader's lease ended.

    A candidate campaigns by creating the election key (``/txb/groups/g1/master``) under a lease of
    its own, only if the key is absent (etcd's compare on create_revision = 0): one create wins,
    the others wait, watching the key, until it is deleted (resigned, or its lease expired) and try
    again. The winner keeps its lease alive (lease.py) and **steps down before that lease can have
    expired on etcd** when keep-alives fail, so a new leader (elected only once etcd has deleted the
    key, i.e. after the lease ended) never overlaps with the old one, as long as the old one stops
    acting within the safety margin (lease.py). It also steps down when the key is deleted or
    overwritten under it (an operator's ``etcdctl del``). The key's create revision is the term's
    epoch: it grows with every election, so whatever a leader writes elsewhere can carry it, and a
    reader can refuse the lower one.

    States (one guarded transition function, ``_move``)::

        IDLE ──campaign()──▶ CAMPAIGNING ──created the key──▶ LEADER ──resign()──▶ RESIGNED
                              │  ▲    └─campaign cancelled─▶ IDLE      │
                              │  └──────────campaign()───────────────┐ │ lease lost, key deleted
                              │                                      │ ▼ or overwritten
                              └──────────────────────────────────── STEPPED_DOWN

        RESIGNED and STEPPED_DOWN may campaign again (with a new lease).
    """

    def __init__(
        self,
        coordinator: Coordinator,
        key: str,
        value: bytes,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        safety_margin_s: float | None = None,
        on_step_down: Callable[[str], None] | None = None,
        eligible: Callable[[int], Awaitable[bool]] | None = None,
    ) -> None:
        self.coordinator = coordinator
        self._eligible = eligible
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        self.safety_margin_s = safety_margin_s
        self.state = ElectionState.IDLE
        self.term: Term | None = None
        self.step_down_reason = ""
        self.stepped_down = asyncio.Event()
        self._on_step_down = on_step_down
        self._keeper: LeaseKeeper | None = None
        self._guard: asyncio.Task[None] | None = None
        self._releasing: asyncio.Task[None] | None = None
        # The revision the key was first seen vacant at (its deletion's, when watched): kept
        # while it stays vacant, so a candidate's rechecks compare against one fixed moment.
        self._vacant_since: int | None = None

    def is_leader(self) -> bool:
        """Leader now, with the lease surely alive on etcd: check before acting as leader."""
        return (
            self.state is ElectionState.LEADER
            and self._keeper is not None
            and self._keeper.is_valid()
        )

    @property
    def keeper(self) -> LeaseKeeper | None:
        """The lease of the current term (None when not leading)."""
        return self._keeper

    # Campaigning.

    async def campaign(self) -> Term:
        """Wait until this candidate leads, then return the term. Cancel it to stop trying.
        Unreachable etcd is retried (every ``RETRY_INTERVAL_S``), never a reason to give up."""
        self._move(ElectionState.CAMPAIGNING)
        try:
            while True:
                try:
                    term = await self._attempt()
                except CoordinationError as e:
                    log.info("campaign for %s: %s; trying again", self.key, e)
                    await asyncio.sleep(RETRY_INTERVAL_S)  # a back-off, not a synchronisation
                    continue
                if term is not None:
                    return term
        except BaseException:
            if self.state is ElectionState.CAMPAIGNING:
                self._move(ElectionState.IDLE)
            raise

    async def _attempt(self) -> Term | None:
        vacant_since = await self._wait_vacant()
        if self._eligible is not None and not await self._eligible(vacant_since):
            await asyncio.sleep(ELIGIBILITY_RECHECK_S)  # a back-off: the better one may win
            return None
        lease = await self.coordinator.grant_lease(self.ttl_s)
        try:
            epoch = await self._create(lease)
        except BaseException:
            with contextlib.suppress(CoordinationError):
                await self.coordinator.revoke_lease(lease)
            raise
        if epoch is None:  # another candidate created it first
            await self.coordinator.revoke_lease(lease)
            return None
        keeper = LeaseKeeper(
            self.coordinator,
            lease,
            on_lost=self._lease_lost,
            safety_margin_s=self.safety_margin_s,
        )
        if not keeper.is_valid():  # the campaign's requests took the lease's whole life
            await self.coordinator.revoke_lease(lease)
            return None
        self._keeper = keeper
        self._vacant_since = None
        self.term = Term(self.key, self.value, lease.id, epoch, time.monotonic())
        self.step_down_reason = ""
        self.stepped_down.clear()
        self._move(ElectionState.LEADER)
        keeper.start()
        self._guard = asyncio.create_task(self._guard_key(epoch), name=f"guard {self.key}")
        log.info("leader of %s (epoch %d, lease %x)", self.key, epoch, lease.id)
        return self.term

    async def _create(self, lease: Lease) -> int | None:
        try:
            return await self.coordinator.create(self.key, self.value, lease=lease)
        except CoordinatorUnavailable:
            # The create may have been applied before the answer was lost: the key then carries
            # this lease. Anything else (or no answer now either) is not a win.
            kv = await self.coordinator.get(self.key)
            if kv is not None and kv.lease_id == lease.id:
                return kv.create_revision
            raise

    async def _wait_vacant(self) -> int:
        """Return once the key is absent: now, or when a watch from the read sees it deleted.
        Returns the revision it was first seen vacant at (see ``eligible``)."""
        while True:
            listing = await self.coordinator.list_prefix(self.key)
            if not any(kv.key == self.key for kv in listing.items):
                if self._vacant_since is None:
                    self._vacant_since = listing.revision
                return self._vacant_since
            self._vacant_since = None
            async with self.coordinator.watch_prefix(
                self.key, start_revision=listing.revision + 1
            ) as events:
                async for event in events:
                    if event.key == self.key and event.kind is EventKind.DELETE:
                        self._vacant_since = event.mod_revision
                        return event.mod_revision

    # Holding.

    def _move(self, to: ElectionState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise AssertionError(f"election {self.key}: {self.state.name} -> {to.name}")
        self.state = to

    def _step_down(self, reason: str) -> None:
        if self.state is not ElectionState.LEADER:
            return
        self._move(ElectionState.STEPPED_DOWN)
        self.step_down_reason = reason
        log.warning("stepped down as leader of %s: %s", self.key, reason)
        self.stepped_down.set()
        if self._on_step_down is not None:
            try:
                self._on_step_down(reason)
            except Exception:  # the step-down stands, whatever the callback did
                log.exception("on_step_down of %s failed", self.key)
        # The lease and the guard are ended in the background: the step-down itself must not
        # wait for etcd (that is what may be unreachable). Taken now, so a new campaign's
        # lease is never the one released.
        keeper, self._keeper = self._keeper, None
        guard, self._guard = self._guard, None
        self._releasing = asyncio.get_running_loop().create_task(_release(keeper, guard))

    def _lease_lost(self, reason: str) -> None:
        self._step_down(f"lease lost: {reason}")

    async def _guard_key(self, epoch: int) -> None:
        """Step down when the key is deleted or written by anyone after this term began."""
        start = epoch + 1
        while self.state is ElectionState.LEADER:
            try:
                async with self.coordinator.watch_prefix(self.key, start_revision=start) as events:
                    async for event in events:
                        if event.key != self.key:
                            continue
                        start = event.mod_revision + 1
                        what = "deleted" if event.kind is EventKind.DELETE else "overwritten"
                        self._step_down(f"the key was {what} (revision {event.mod_revision})")
                        return
            except CoordinationError as e:
                # Cannot watch now: the lease keeper decides whether leadership survives.
                log.info("guard of %s: %s; watching again", self.key, e)
                await asyncio.sleep(RETRY_INTERVAL_S)  # a back-off, not a synchronisation

    async def _release_now(self) -> None:
        keeper, self._keeper = self._keeper, None
        guard, self._guard = self._guard, None
        await _release(keeper, guard)
        if self._releasing is not None:
            await asyncio.gather(self._releasing, return_exceptions=True)

    async def resign(self) -> None:
        """Give up leadership now: the lease is revoked, so the key goes at once and another
        candidate can win without waiting out the TTL. Not leading: nothing to do."""
        if self.state is ElectionState.LEADER:
            self._move(ElectionState.RESIGNED)
        await self._release_now()


async def _release(keeper: LeaseKeeper | None, guard: asyncio.Task[None] | None) -> None:
    """End a term's guard and lease (revoked: its key goes now, if etcd can be reached)."""
    try:
        if guard is not None and guard is not asyncio.current_task():
            await cancel_and_wait(guard)
    finally:  # also when the release itself is cancelled: the keep-alives must stop
        if keeper is not None:
            await keeper.stop(revoke=True)


async def watch_leader(
    coordinator: Coordinator, key: str, *, retry_interval_s: float = RETRY_INTERVAL_S
) -> AsyncIterator[KeyValue | None]:
    """The leader of ``key`` now (``None``: no leader), then each time it changes, for as long
    as the caller iterates. A broken watch is listed and watched again from the listing's
    revision, so no change is missed; an unreachable etcd is retried every
    ``retry_interval_s`` (and the caller keeps the last leader it was told of meanwhile)."""
    last: KeyValue | None = None
    first = True
    while True:
        try:
            listing = await coordinator.list_prefix(key)
            current = next((kv for kv in listing.items if kv.key == key), None)
            if first or _changed(last, current):
                first = False
                last = current
                yield current
            async with coordinator.watch_prefix(key, start_revision=listing.revision + 1) as ev:
                async for event in ev:
                    if event.key != key:
                        continue
                    if event.kind is EventKind.DELETE:
                        last = None
                        yield None
                        continue
                    # A watch event carries no lease or create revision: read them.
                    current = await coordinator.get(key)
                    if _changed(last, current):
                        last = current
                        yield current
        except CoordinationError as e:
            log.info("watching the leader of %s: %s; listing again", key, e)
            await asyncio.sleep(retry_interval_s)  # a back-off, not a synchronisation


def _changed(before: KeyValue | None, after: KeyValue | None) -> bool:
    if before is None or after is None:
        return before is not after
    return (before.create_revision, before.value) != (after.create_revision, after.value)
