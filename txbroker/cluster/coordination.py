"""The coordination interface: what broker groups, the NameServer and failover need from a
consistent store, and nothing more (docs/cluster.md).

The engine behind it is etcd (``txbroker/cluster/etcd.py``); no consensus is written here. The
interface stays small so the engine can be swapped without touching its callers: keys and
prefixes, leases that delete their keys when they end, compare-and-set on a key's revision, and
a watch of a prefix from a revision on. Keys are ``/``-separated text; values are bytes the
caller encodes. Every write gets a higher revision, so "list at revision R, then watch from
R + 1" misses nothing and sees nothing twice.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

__all__ = [
    "DEFAULT_REQUEST_TIMEOUT_S",
    "Coordinator",
    "EventKind",
    "KeyValue",
    "Lease",
    "Listing",
    "Watch",
    "WatchEvent",
]

# A request to a healthy etcd on a LAN answers in milliseconds; an fsync on a slow disk can take
# a few hundred. 2 s lets that pass, and is no longer than the shortest lease etcd grants (2 s),
# so an unanswered keep-alive is known for one before the lease could have ended (a lease
# keeper bounds each keep-alive by its own step-down deadline as well, lease.py).
DEFAULT_REQUEST_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int  # the revision that created the key (since its last deletion)
    mod_revision: int  # the revision of its last write: what put_if_revision compares
    lease_id: int  # 0 when the key outlives every session


@dataclass(frozen=True, slots=True)
class Listing:
    """The keys under a prefix, in key order, as of ``revision``: watch from ``revision + 1``
    to follow the prefix from exactly this state on."""

    revision: int
    items: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease granted by the store: every key put with it is deleted when it ends.

    ``granted_at_s`` is this process's ``time.monotonic()`` taken before the grant was asked
    for, so ``granted_at_s + ttl_s`` is a local time at which the lease is still alive on the
    store (the store started counting later): what a holder steps down by (lease.py)."""

    id: int
    ttl_s: int  # as granted: the store may raise a TTL below its minimum
    granted_at_s: float


class EventKind(enum.Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: EventKind
    key: str
    value: bytes  # empty for DELETE
    mod_revision: int  # for DELETE, the revision of the deletion
    create_revision: int = 0  # as KeyValue's; 0 for DELETE


class Watch(AsyncIterator[WatchEvent], abc.ABC):
    """The events under a prefix, in revision order, as an async iterator. Use it as an async
    context manager: the watch is registered on the store when ``async with`` is entered (so a
    write made after that is seen) and cancelled when it is left.

    ::

        async with coordinator.watch_prefix("/txb/brokers/") as events:
            async for event in events:
                ...
    """

    @abc.abstractmethod
    async def start(self) -> None:
        """Register the watch on the store; returns once the store has confirmed it."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Cancel the watch; iteration ends."""

    @abc.abstractmethod
    async def __anext__(self) -> WatchEvent: ...

    def __aiter__(self) -> Self:
        return self

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Coordinator(abc.ABC):
    """A session with the coordination store. Every call is bounded by the implementation's
    request timeout and raises :class:`~txbroker.errors.CoordinatorUnavailable` when the store
    does not answer in time; a key or lease that is gone is an answer, not an error (``None``,
    ``False``), except where the call needs the lease (:class:`~txbroker.errors.LeaseExpired`).
    """

    # Keys.

    @abc.abstractmethod
    async def get(self, key: str) -> KeyValue | None: ...

    @abc.abstractmethod
    async def list_prefix(self, prefix: str) -> Listing: ...

    @abc.abstractmethod
    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        """Write ``key`` (under ``lease`` when given); returns the write's revision."""

    @abc.abstractmethod
    async def delete(self, key: str) -> bool:
        """Whether there was a key to delete."""

    @abc.abstractmethod
    async def delete_prefix(self, prefix: str) -> int:
        """How many keys were deleted."""

    # Compare-and-set: one writer wins, the others learn they lost.

    @abc.abstractmethod
    async def create(self, key: str, value: bytes, *, lease: Lease | None = None) -> int | None:
        """Write ``key`` only if it does not exist; the write's revision, or ``None`` when the
        key exists (someone else created it first)."""

    @abc.abstractmethod
    async def put_if_revision(
        self, key: str, value: bytes, mod_revision: int, *, lease: Lease | None = None
    ) -> int | None:
        """Write ``key`` only if its last write was ``mod_revision`` (0: only if it does not
        exist); the write's revision, or ``None`` when someone wrote or deleted it since."""

    # Leases.

    @abc.abstractmethod
    async def grant_lease(self, ttl_s: int) -> Lease: ...

    @abc.abstractmethod
    async def keepalive(self, lease: Lease) -> int:
        """Renew ``lease`` once; returns its TTL from now, in seconds. Raises ``LeaseExpired``
        when it has already ended. (``LeaseKeeper`` does this on a timer.)"""

    @abc.abstractmethod
    async def revoke_lease(self, lease: Lease) -> None:
        """End ``lease`` now, deleting its keys; a lease that already ended is not an error."""

    # Watches.

    @abc.abstractmethod
    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        """The events under ``prefix`` from ``start_revision`` on (default: from when the watch
        starts). A revision the store has compacted away raises ``CoordinationError``."""

    # The session.

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session: watches end; leases are left to expire (or be revoked first)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
