"""A lease kept alive, and the local moment before which it is surely still alive on etcd.

etcd deletes a lease's keys when no keep-alive has reached it for the TTL, and a holder cut off
from etcd does not learn when that happens, so it must give up *before* it can have happened.
:class:`LeaseKeeper` keeps ``valid_until_s`` on the monotonic clock (the send time of the last
answered keep-alive, plus its TTL, minus a safety margin) and moves to LOST there at the latest,
even while a keep-alive still hangs; a writer checks :meth:`LeaseKeeper.is_valid` before each
acknowledgement.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Final, Self

from txbroker.cluster._tasks import cancel_and_wait
from txbroker.cluster.coordination import Coordinator, Lease
from txbroker.errors import CoordinationError, InvalidArgument, LeaseExpired

__all__ = ["LeaseKeeper", "LeaseState", "default_safety_margin_s"]

log = logging.getLogger(__name__)

# etcd's own client (clientv3) renews a lease a third of its TTL after the last renewal: two more
# attempts fit in a TTL if one is lost.
KEEPALIVE_FRACTION: Final = 1 / 3
# After a failed keep-alive, try again soon (not a whole interval later): a second endpoint or a
# briefly unreachable etcd should not cost the lease.
RETRY_INTERVAL_S: Final = 0.5
# The margin's floor: the event loop of a busy broker may run a timer a few hundred ms late.
MIN_SAFETY_MARGIN_S: Final = 0.5
SAFETY_MARGIN_FRACTION: Final = 0.2


def default_safety_margin_s(ttl_s: float) -> float:
    return max(MIN_SAFETY_MARGIN_S, ttl_s * SAFETY_MARGIN_FRACTION)


class LeaseState(enum.Enum):
    KEEPING = "keeping"
    LOST = "lost"
    ENDED = "ended"


_TRANSITIONS: Final = {
    LeaseState.KEEPING: frozenset({LeaseState.LOST, LeaseState.ENDED}),
    LeaseState.LOST: frozenset(
        {LeaseState.ENDED}
    ),  # stop() after a loss (still revokes, best effort)
    LeaseState.ENDED: frozenset[LeaseState](),
}


class LeaseKeeper:
    """Keeps ``lease`` alive on a timer until :meth:`stop`, or until it is lost.

    ::

        keeper = await LeaseKeeper.grant(coordinator, ttl_s=10, on_lost=stop_writing)
        await coordinator.put("/txb/brokers/g1/b1", info, lease=keeper.lease)
        ...
        if keeper.is_valid():  # before acting on what the lease guards
            ...
        await keeper.stop()  # revokes: its keys go now, not a TTL later

    ``valid_until_s`` is::

        (local time a keep-alive that etcd answered was *sent*) + (the TTL it answered) - margin

    (first with the grant's send time, ``Lease.granted_at_s``). etcd started counting the TTL
    when the request reached it, which is after it was sent, so the lease lives on etcd at least
    until ``sent + TTL``; an etcd leader change only extends leases, never shortens them. When
    keep-alives fail (etcd down, cut off, stopped) the keeper moves to LOST at ``valid_until_s``
    at the latest, calling ``on_lost`` there, even while a keep-alive request still hangs.

    The margin (``safety_margin_s``, by default a fifth of the TTL, at least 0.5 s) is for what
    lies between the timer and the effect: the event loop running the timer late, the ``on_lost``
    callback taking effect (a master refusing writes), and the two clocks' rates differing over a
    TTL (parts per million). :meth:`is_valid` is a read of the clock, correct even when the loop
    is too busy to have run the timer.

    States (one guarded transition function, ``_move``)::

        KEEPING ──keep-alives failed until valid_until_s, or etcd says the lease is gone──▶ LOST
           └────stop(): revoked (its keys deleted now) or let go───────────────────────▶ ENDED

    ``stop()`` after a loss moves LOST to ENDED, and still revokes: the lease may live on etcd for
    up to the margin, and revoking hands its keys over sooner. ENDED is final; a holder that lost
    its lease campaigns or registers again with a new one.
    """

    def __init__(
        self,
        coordinator: Coordinator,
        lease: Lease,
        *,
        on_lost: Callable[[str], None] | None = None,
        safety_margin_s: float | None = None,
    ) -> None:
        margin_s = (
            default_safety_margin_s(lease.ttl_s) if safety_margin_s is None else safety_margin_s
        )
        if not 0 <= margin_s < lease.ttl_s:
            raise InvalidArgument(f"safety margin {margin_s} s must be in [0, TTL {lease.ttl_s} s)")
        self.coordinator = coordinator
        self.lease = lease
        self.safety_margin_s = margin_s
        self.interval_s = lease.ttl_s * KEEPALIVE_FRACTION
        self.valid_until_s = lease.granted_at_s + lease.ttl_s - margin_s
        self.last_renewed_s = lease.granted_at_s  # send time of the last answered keep-alive
        self.state = LeaseState.KEEPING
        self.lost_reason = ""
        self.lost = asyncio.Event()
        self.renewed = asyncio.Event()  # set at every answered keep-alive (clear to wait again)
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None
        self._revoking: asyncio.Future[None] | None = None

    @classmethod
    async def grant(
        cls,
        coordinator: Coordinator,
        ttl_s: int,
        *,
        on_lost: Callable[[str], None] | None = None,
        safety_margin_s: float | None = None,
    ) -> LeaseKeeper:
        """Grant a lease of ``ttl_s`` and start keeping it."""
        lease = await coordinator.grant_lease(ttl_s)
        keeper = cls(coordinator, lease, on_lost=on_lost, safety_margin_s=safety_margin_s)
        keeper.start()
        return keeper

    def start(self) -> None:
        assert self._task is None, "a keeper starts once"
        self._task = asyncio.create_task(self._run(), name=f"lease {self.lease.id:x}")

    def is_valid(self) -> bool:
        """Whether the lease is surely alive on etcd now (with the safety margin to spare)."""
        return self.state is LeaseState.KEEPING and time.monotonic() < self.valid_until_s

    def remaining_s(self) -> float:
        """How long :meth:`is_valid` stays true without another answered keep-alive."""
        if self.state is not LeaseState.KEEPING:
            return 0.0
        return max(0.0, self.valid_until_s - time.monotonic())

    async def stop(self, *, revoke: bool = True) -> None:
        """Stop keeping the lease; ``revoke`` (the default) ends it on etcd now, deleting its keys
        (best effort: an unreachable etcd lets it expire within its TTL instead).

        The keep-alives stop and the revocation starts before the first ``await``, and the
        revocation is shielded: a ``stop()`` that is itself cancelled (a ``resign()`` in a task
        being cancelled) still revokes, and at worst the lease lapses within its TTL."""
        if self.state is LeaseState.ENDED:
            return
        self._move(LeaseState.ENDED)  # first: the loop ends at its next step whatever follows
        if self._task is not None:
            self._task.cancel()
        if revoke:
            self._revoking = asyncio.ensure_future(self._revoke())
        try:
            if self._task is not None:
                await cancel_and_wait(self._task)
        finally:
            if self._revoking is not None:
                await asyncio.shield(self._revoking)

    async def _revoke(self) -> None:
        try:
            await self.coordinator.revoke_lease(self.lease)
        except CoordinationError as e:
            log.warning("lease %x not revoked (it expires by itself): %s", self.lease.id, e)

    async def __aenter__(self) -> Self:
        if self._task is None:
            self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # The loop.

    def _move(self, to: LeaseState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise AssertionError(f"lease {self.lease.id:x}: {self.state.name} -> {to.name}")
        self.state = to

    def _lose(self, reason: str) -> None:
        if self.state is not LeaseState.KEEPING:  # stopped meanwhile: nothing is lost
            return
        self._move(LeaseState.LOST)
        self.lost_reason = reason
        log.warning("lease %x lost: %s", self.lease.id, reason)
        self.lost.set()
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:  # the holder's bug must not keep the loss from being recorded
                log.exception("on_lost of lease %x failed", self.lease.id)

    async def _run(self) -> None:
        next_at_s = self.last_renewed_s + self.interval_s
        failures: list[str] = []
        while self.state is LeaseState.KEEPING:
            now = time.monotonic()
            if now >= self.valid_until_s:
                why = "; ".join(failures[-3:]) or "no keep-alive was due in time"
                self._lose(f"no keep-alive answered in time to be sure it lives ({why})")
                return
            if now < next_at_s:
                # A timer (the keep-alive schedule), not a synchronisation.
                await asyncio.sleep(min(next_at_s, self.valid_until_s) - now)
                continue
            sent_s = time.monotonic()
            try:
                # Never wait for an answer past the moment the holder must give up anyway.
                async with asyncio.timeout(max(0.0, self.valid_until_s - sent_s)):
                    ttl_s = await self.coordinator.keepalive(self.lease)
            except TimeoutError:
                failures.append("a keep-alive was still unanswered at the deadline")
                continue  # the loop's first check reports the loss
            except LeaseExpired as e:
                self._lose(str(e))
                return
            except CoordinationError as e:
                failures.append(str(e))
                next_at_s = time.monotonic() + min(RETRY_INTERVAL_S, self.interval_s)
                continue
            failures.clear()
            self.last_renewed_s = sent_s
            self.valid_until_s = sent_s + ttl_s - self.safety_margin_s
            next_at_s = sent_s + self.interval_s
            self.renewed.set()
