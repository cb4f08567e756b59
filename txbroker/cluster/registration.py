"""A registration: a key that exists exactly while its owner lives (``/txb/brokers/g1/b1``).

The key is put under a lease the owner keeps alive (lease.py). When the owner dies or is cut
off, etcd deletes the key within the TTL, and everyone watching the prefix (the NameServer,
the election's candidates, ``cluster status``) sees it go. When the owner itself loses the
lease it registers again with a new lease as soon as etcd answers, so a broker that survives a
partition reappears by itself (:class:`Registration` draws the states).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import Final

from txbroker.cluster._tasks import cancel_and_wait
from txbroker.cluster.coordination import Coordinator
from txbroker.cluster.lease import LeaseKeeper
from txbroker.errors import CoordinationError

__all__ = ["Registration", "RegistrationState"]

log = logging.getLogger(__name__)

# A registration only says "alive": 10 s keeps etcd's lease traffic low (a keep-alive every
# ~3.3 s per broker) and still drops a dead broker from routes within seconds.
DEFAULT_TTL_S: Final = 10
RETRY_INTERVAL_S: Final = 0.5  # between attempts to register again while etcd is unreachable


class RegistrationState(enum.Enum):
    UNREGISTERED = "unregistered"
    REGISTERED = "registered"
    REREGISTERING = "reregistering"


_TRANSITIONS: Final = {
    RegistrationState.UNREGISTERED: frozenset({RegistrationState.REGISTERED}),
    RegistrationState.REGISTERED: frozenset(
        {RegistrationState.REREGISTERING, RegistrationState.UNREGISTERED}
    ),
    RegistrationState.REREGISTERING: frozenset(
        {RegistrationState.REGISTERED, RegistrationState.UNREGISTERED}
    ),
}


class Registration:
    """``key`` = ``value`` under a kept lease, from :meth:`start` to :meth:`stop`.

    ::

        registration = Registration(coordinator, "/txb/brokers/g1/b1", info)
        await registration.start()  # CoordinatorUnavailable if etcd does not answer
        await registration.update(new_info)  # same lease
        await registration.stop()  # the key goes now

    States::

        UNREGISTERED ──start()──▶ REGISTERED ──lease lost──▶ REREGISTERING ──put again──▶ REGISTERED
              ▲                       │                            │
              └────────stop(): lease revoked, key gone─────────────┘
    """

    def __init__(
        self, coordinator: Coordinator, key: str, value: bytes, *, ttl_s: int = DEFAULT_TTL_S
    ) -> None:
        self.coordinator = coordinator
        self.key = key
        self.value = value
        self.ttl_s = ttl_s
        self.state = RegistrationState.UNREGISTERED
        self.registrations = 0  # how many times the key was put under a new lease
        self._keeper: LeaseKeeper | None = None
        self._again: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register now; raises when etcd cannot be reached (a process should not start as if
        it were registered)."""
        await self._register(RegistrationState.UNREGISTERED)

    async def update(self, value: bytes) -> None:
        """Change the value, under the same lease (a value put while re-registering is used)."""
        self.value = value
        if self.state is RegistrationState.REGISTERED and self._keeper is not None:
            await self.coordinator.put(self.key, value, lease=self._keeper.lease)

    async def stop(self) -> None:
        """Unregister: the lease is revoked, so the key goes now (within the TTL when etcd
        cannot be reached, or when this call is cancelled midway)."""
        if self.state is not RegistrationState.UNREGISTERED:
            self._move(RegistrationState.UNREGISTERED)
        again, self._again = self._again, None
        try:
            if again is not None:
                await cancel_and_wait(again)
        finally:
            keeper, self._keeper = self._keeper, None
            if keeper is not None:
                await keeper.stop(revoke=True)

    def _move(self, to: RegistrationState) -> None:
        if to not in _TRANSITIONS[self.state]:
            raise AssertionError(f"registration {self.key}: {self.state.name} -> {to.name}")
        self.state = to

    async def _register(self, from_state: RegistrationState) -> None:
        keeper = await LeaseKeeper.grant(self.coordinator, self.ttl_s, on_lost=self._lost)
        try:
            await self.coordinator.put(self.key, self.value, lease=keeper.lease)
        except BaseException:
            await keeper.stop(revoke=True)
            raise
        if self.state is not from_state:  # stopped meanwhile
            await keeper.stop(revoke=True)
            return
        self._keeper = keeper
        self.registrations += 1
        self._move(RegistrationState.REGISTERED)

    def _lost(self, reason: str) -> None:
        if self.state is not RegistrationState.REGISTERED:
            return
        self._move(RegistrationState.REREGISTERING)
        log.warning("registration %s lost (%s); registering again", self.key, reason)
        self._again = asyncio.get_running_loop().create_task(self._register_again())

    async def _register_again(self) -> None:
        old, self._keeper = self._keeper, None
        if old is not None:
            with contextlib.suppress(CoordinationError):
                await old.stop(revoke=True)
        while self.state is RegistrationState.REREGISTERING:
            try:
                await self._register(RegistrationState.REREGISTERING)
            except CoordinationError as e:
                log.info("registering %s again: %s", self.key, e)
                await asyncio.sleep(RETRY_INTERVAL_S)  # a back-off, not a synchronisation
