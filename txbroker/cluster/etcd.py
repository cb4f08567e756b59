"""The coordination interface on etcd's v3 API, through the ``aetcd`` client (asyncio, gRPC).

aetcd is a maintained asyncio client of the v3 API; python-etcd3, which it descends from, blocks
on every call. What it was checked against before it was chosen is in docs/cluster.md ("The
client"). Around it: a deadline on every call, one client per endpoint of the URL with failover
between them, keep-alives through the ``LeaseKeepAlive`` stub, gRPC keep-alive pings, and its
errors turned into txbroker's (:class:`EtcdCoordinator`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc

from txbroker.cluster._tasks import cancel_and_wait
from txbroker.cluster.coordination import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Coordinator,
    EventKind,
    KeyValue,
    Lease,
    Listing,
    Watch,
    WatchEvent,
)
from txbroker.cluster.url import CoordinatorUrl, Endpoint, parse_coordinator_url
from txbroker.errors import CoordinationError, CoordinatorUnavailable, InvalidArgument, LeaseExpired

__all__ = ["EtcdCoordinator", "connect_etcd"]

T = TypeVar("T")

# gRPC channel keep-alive: etcd's default --grpc-keepalive-min-time is 5 s (a client pinging
# more often is sent GOAWAY); 10 s + a 5 s answer bound ends a dead watch stream within ~15 s.
_GRPC_OPTIONS: Final = {
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
    "grpc.keepalive_permit_without_calls": 1,
    # gRPC waits out a growing back-off (1 s, x1.6, up to 120 s) before it dials a refused
    # endpoint again, failing every call at once meanwhile: an etcd back after a restart would
    # stay unreachable for minutes. Capped at 1 s, a call retrying within its deadline
    # (EtcdCoordinator._call) reaches it about a second after it serves.
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1_000,
}
# Between passes over every endpoint, while the deadline allows: short, since each pass that
# finds none reachable costs a refused dial, not a wait.
_RETRY_PAUSE_S: Final = 0.1
_UNREACHABLE: Final = (
    aetcd.exceptions.ConnectionFailedError,
    aetcd.exceptions.ConnectionTimeoutError,
    aetcd.exceptions.WatchTimeoutError,
)


def _not_sent(error: BaseException) -> bool:
    """Whether a failure shows the request never left this process: gRPC could not connect
    (refused, no route), so sending it to another endpoint cannot apply it twice."""
    return isinstance(error, aetcd.exceptions.ConnectionFailedError) and (
        "failed to connect" in str(error).lower()
    )


def _lease_gone(error: BaseException) -> bool:
    return "lease not found" in str(error).lower()


class EtcdCoordinator(Coordinator):
    """A :class:`Coordinator` on one etcd cluster, reached through any of its endpoints.

    ::

        async with await connect_etcd("etcd://127.0.0.1:2379") as coordinator:
            await coordinator.put("/txb/hello", b"world")

    What is done around aetcd, and why:

    - **Every call has a deadline** (``request_timeout_s``): aetcd's gRPC timeout, and an asyncio
      timeout around the whole call (aetcd waits for some things, such as a watch's creation, on
      its own).
    - **Several endpoints**: aetcd talks to one ``host:port``, so there is one aetcd client per
      endpoint of the URL. A call goes to the endpoint that answered last; when that one cannot be
      reached it moves to the next, and round again after a short pause, all within the same
      deadline (an etcd restarting is answered about a second after it serves: gRPC's reconnect
      back-off is capped at 1 s). A write whose request may have reached etcd (a deadline passed,
      a stream broke) is *not* sent again elsewhere, since it may have been applied: the caller
      gets ``CoordinatorUnavailable`` and decides (the election checks whether its key carries its
      lease, lease.py / election.py).
    - **Keep-alive** uses aetcd's ``LeaseKeepAlive`` stub directly: ``refresh_lease`` returns from
      inside the stream's ``async for`` and leaves the stream to the garbage collector; here the
      stream is cancelled as soon as its one answer is read.
    - **Errors** become txbroker's (errors.py): no endpoint answering within the deadline is
      :class:`CoordinatorUnavailable`, a lease etcd no longer knows is :class:`LeaseExpired`,
      anything else :class:`CoordinationError`; each message names the endpoint and the request.
    - **gRPC keep-alive pings** every 10 s (etcd refuses pings more often than every 5 s by
      default, ``--grpc-keepalive-min-time``), so a watch on a stopped or cut-off etcd ends within
      ~15 s instead of hanging.
    """

    def __init__(
        self, url: CoordinatorUrl, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    ) -> None:
        if url.scheme != "etcd":
            raise InvalidArgument(f"{url}: EtcdCoordinator speaks etcd:// only")
        if not request_timeout_s > 0:
            raise InvalidArgument(f"request_timeout_s must be > 0, not {request_timeout_s}")
        self.url = url
        self.request_timeout_s = request_timeout_s
        # aetcd's timeout is whole seconds in its signature but is handed to gRPC as a float.
        self._clients = [
            aetcd.Client(e.host, e.port, timeout=request_timeout_s, options=_GRPC_OPTIONS)
            for e in url.endpoints
        ]
        self._current = 0  # the endpoint that answered last
        self._watches: set[EtcdWatch] = set()
        self._closed = False

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint the next call goes to first."""
        return self.url.endpoints[self._current]

    async def ping(self) -> None:
        """Read one key: proves an endpoint answers (``connect_etcd`` does)."""
        await self._call("connect (read /txb/)", lambda c: c.get(b"/txb/"), idempotent=True)

    # The one way every request is made.

    async def _call(
        self,
        request: str,
        op: Callable[[Any], Awaitable[T]],
        *,
        idempotent: bool,
    ) -> T:
        """Run ``op(client)`` against the current endpoint, then the others, within the
        deadline; an idempotent ``op`` moves on after any unreachable error, a write only
        after one that proves it was never sent."""
        if self._closed:
            raise CoordinationError(f"{request}: the etcd session ({self.url}) is closed")
        budget_s = self.request_timeout_s
        end = time.monotonic() + budget_s
        failures: dict[Endpoint, str] = {}  # the last failure seen at each endpoint
        n = len(self._clients)
        while True:
            first = self._current
            for step in range(n):
                i = (first + step) % n
                endpoint = self.url.endpoints[i]
                left_s = end - time.monotonic()
                if left_s <= 0:
                    break
                try:
                    async with asyncio.timeout(left_s):
                        result = await op(self._clients[i])
                except TimeoutError as e:  # the asyncio bound: the request may have arrived
                    failures[endpoint] = f"no answer within {budget_s:g} s"
                    self._current = (i + 1) % n
                    if not idempotent:
                        raise self._unavailable(request, failures) from e
                    continue
                except _UNREACHABLE as e:
                    failures[endpoint] = _describe(e, budget_s)
                    self._current = (i + 1) % n
                    if not (idempotent or _not_sent(e)):
                        raise self._unavailable(request, failures) from e
                    continue
                except aetcd.exceptions.RevisionCompactedError as e:
                    raise CoordinationError(
                        f"{request} at etcd {endpoint}: revision compacted below "
                        f"{e.compacted_revision}; list again and watch from the listing's "
                        "revision"
                    ) from e
                except aetcd.exceptions.ClientError as e:
                    if _lease_gone(e):
                        raise LeaseExpired(
                            f"{request} at etcd {endpoint}: the lease is gone"
                        ) from e
                    raise CoordinationError(f"{request} at etcd {endpoint} failed: {e}") from e
                self._current = i
                return result
            # No endpoint answered this pass, and every failure was safe to retry (a refused
            # dial, or an idempotent read): an etcd restarting, or a leader being elected,
            # comes back within the deadline more often than not.
            left_s = end - time.monotonic()
            if left_s <= _RETRY_PAUSE_S:
                raise self._unavailable(request, failures)
            await asyncio.sleep(_RETRY_PAUSE_S)

    def _unavailable(self, request: str, failures: dict[Endpoint, str]) -> CoordinatorUnavailable:
        tried = "; ".join(f"{e}: {why}" for e, why in failures.items())
        tried = tried or f"no time left of {self.request_timeout_s:g} s"
        return CoordinatorUnavailable(
            f"{request}: no etcd endpoint of {self.url} answered ({tried}). Is etcd running "
            "and reachable? (docs/cluster.md)"
        )

    # Keys.

    async def get(self, key: str) -> KeyValue | None:
        got = await self._call(f"get {key}", lambda c: c.get(key.encode()), idempotent=True)
        return None if got is None else _kv(got)

    async def list_prefix(self, prefix: str) -> Listing:
        got = await self._call(
            f"list {prefix}*",
            lambda c: c.get_prefix(prefix.encode(), sort_order="ascend"),
            idempotent=True,
        )
        return Listing(got.header.revision, tuple(_kv(kv) for kv in got.kvs))

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        done = await self._call(
            f"put {key}",
            lambda c: c.put(key.encode(), value, lease=_lease_id(lease)),
            idempotent=False,
        )
        return int(done.header.revision)

    async def delete(self, key: str) -> bool:
        # Not retried elsewhere once possibly sent: the effect would repeat safely, but the
        # answer (was there a key?) would not.
        done = await self._call(f"delete {key}", lambda c: c.delete(key.encode()), idempotent=False)
        return done is not None

    async def delete_prefix(self, prefix: str) -> int:
        done = await self._call(
            f"delete {prefix}*", lambda c: c.delete_prefix(prefix.encode()), idempotent=False
        )
        return int(done.deleted)

    # Compare-and-set.

    async def create(self, key: str, value: bytes, *, lease: Lease | None = None) -> int | None:
        return await self._put_if(f"create {key}", key, value, 0, lease, create=True)

    async def put_if_revision(
        self, key: str, value: bytes, mod_revision: int, *, lease: Lease | None = None
    ) -> int | None:
        return await self._put_if(
            f"put {key} if at revision {mod_revision}", key, value, mod_revision, lease
        )

    async def _put_if(
        self,
        request: str,
        key: str,
        value: bytes,
        mod_revision: int,
        lease: Lease | None,
        *,
        create: bool = False,
    ) -> int | None:
        k = key.encode()

        async def txn(c: Any) -> tuple[bool, list[Any]]:
            # A key that does not exist has mod_revision 0 (and create_revision 0) in etcd's
            # compare, so mod == 0 is "absent"; mod == R is "unchanged since R".
            target = c.transactions.create(k) if create else c.transactions.mod(k)
            compare = target == mod_revision
            result: tuple[bool, list[Any]] = await c.transaction(
                compare=[compare],
                # A put inside a transaction does not keep the key's lease: name it again.
                success=[c.transactions.put(k, value, lease=_lease_id(lease))],
                failure=[],
            )
            return result

        succeeded, responses = await self._call(request, txn, idempotent=False)
        if not succeeded:
            return None
        return int(responses[0].response_put.header.revision)

    # Leases.

    async def grant_lease(self, ttl_s: int) -> Lease:
        if ttl_s < 1:
            raise InvalidArgument(f"a lease lives at least 1 s, not {ttl_s}")
        asked_at_s = time.monotonic()  # before the request: etcd starts counting later
        # Not idempotent, but a second grant only leaves a lease with no keys to expire.
        granted = await self._call(
            f"grant a {ttl_s} s lease", lambda c: c.lease(ttl_s), idempotent=True
        )
        return Lease(int(granted.id), int(granted.ttl), asked_at_s)

    async def keepalive(self, lease: Lease) -> int:
        async def once(c: Any) -> int:
            await c.connect()  # the stubs exist once the client has (lazily) connected
            call = c.leasestub.LeaseKeepAlive(
                iter([aetcd.rpc.LeaseKeepAliveRequest(ID=lease.id)]),
                timeout=self.request_timeout_s,
                metadata=c.metadata,
            )
            try:
                reply = await call.read()
            except aetcd.rpc.AioRpcError as e:
                aetcd.exceptions._handle_exception(e)  # aetcd's own mapping, as its calls use
                raise  # unreachable: _handle_exception always raises
            finally:
                call.cancel()
            if reply is None or not hasattr(reply, "TTL"):  # the stream ended unanswered
                raise aetcd.exceptions.ConnectionFailedError("keep-alive stream ended")
            return int(reply.TTL)

        ttl_s = await self._call(f"keep lease {lease.id:x} alive", once, idempotent=True)
        if ttl_s <= 0:  # etcd answers a lease it no longer has with TTL 0, not an error
            raise LeaseExpired(f"lease {lease.id:x} has expired or was revoked (etcd {self.url})")
        return ttl_s

    async def revoke_lease(self, lease: Lease) -> None:
        with contextlib.suppress(LeaseExpired):
            await self._call(
                f"revoke lease {lease.id:x}", lambda c: c.revoke_lease(lease.id), idempotent=True
            )

    # Watches.

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> Watch:
        return EtcdWatch(self, prefix, start_revision)

    # The session.

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in list(self._watches):
            await w.close()
        for c in self._clients:
            with contextlib.suppress(Exception):  # closing a broken channel is still closing
                async with asyncio.timeout(self.request_timeout_s):
                    await c.close()


class EtcdWatch(Watch):
    """A watch of one prefix on the endpoint that answered last (docs in :class:`Watch`).

    Iteration raises :class:`CoordinatorUnavailable` when the stream breaks (its etcd died or
    was cut off) and :class:`CoordinationError` when ``start_revision`` was compacted away; the
    caller lists again and watches from the listing's revision + 1."""

    def __init__(self, coordinator: EtcdCoordinator, prefix: str, start_revision: int | None):
        self._coordinator = coordinator
        self._prefix = prefix
        self._start_revision = start_revision
        self._watch: Any = None
        self._events: AsyncIterator[Any] | None = None
        self._pending: asyncio.Future[Any] | None = None
        self._endpoint: Endpoint | None = None
        self._closed = False

    @property
    def _request(self) -> str:
        since = "" if self._start_revision is None else f" from revision {self._start_revision}"
        return f"watch {self._prefix}*{since}"

    async def start(self) -> None:
        assert self._watch is None, "a watch starts once"

        async def create(c: Any) -> Any:
            return await c.watch_prefix(self._prefix.encode(), start_revision=self._start_revision)

        self._watch = await self._coordinator._call(self._request, create, idempotent=True)
        self._endpoint = self._coordinator.endpoint
        self._events = aiter(self._watch)
        self._coordinator._watches.add(self)

    async def __anext__(self) -> WatchEvent:
        if self._events is None or self._closed:
            raise StopAsyncIteration
        # aetcd's iterator is an async generator: cancelling a wait on it (a caller's timeout)
        # would end it for good. The wait runs in a task of its own, shielded, so a cancelled
        # __anext__ leaves it running for the next call and no event is lost.
        if self._pending is None:
            self._pending = asyncio.ensure_future(_next_or_none(self._events))
        pending = self._pending
        try:
            event = await asyncio.shield(pending)
        except asyncio.CancelledError:
            if pending.cancelled():  # close() ended it, not the caller's own cancellation
                raise StopAsyncIteration from None
            raise
        except aetcd.exceptions.RevisionCompactedError as e:
            self._end()
            raise CoordinationError(
                f"{self._request} at etcd {self._endpoint}: revision compacted below "
                f"{e.compacted_revision}; list again and watch from the listing's revision"
            ) from e
        except aetcd.exceptions.ClientError as e:
            self._end()
            raise CoordinatorUnavailable(
                f"{self._request} at etcd {self._endpoint}: the watch stream broke ({e}); "
                "list again and watch from the listing's revision"
            ) from e
        self._pending = None
        if event is None:
            self._end()
            raise StopAsyncIteration
        kv = event.kv
        if event.kind == "DELETE":
            return WatchEvent(EventKind.DELETE, kv.key.decode(), b"", int(kv.mod_revision))
        return WatchEvent(
            EventKind.PUT,
            kv.key.decode(),
            bytes(kv.value),
            int(kv.mod_revision),
            int(kv.create_revision),
        )

    def _end(self) -> None:
        self._pending = None
        self._closed = True

    async def close(self) -> None:
        if self._closed and self._watch is None:
            return
        self._closed = True
        self._coordinator._watches.discard(self)
        if self._pending is not None:
            await cancel_and_wait(self._pending)
            self._pending = None
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(Exception):  # a broken stream has nothing left to cancel
                async with asyncio.timeout(self._coordinator.request_timeout_s):
                    await watch.cancel()


async def _next_or_none(events: AsyncIterator[Any]) -> Any:
    """The next event, or None when the iteration ended (a task cannot end in
    StopAsyncIteration cleanly)."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None


async def connect_etcd(
    url: str | CoordinatorUrl, *, request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
) -> EtcdCoordinator:
    """A session with the etcd cluster at ``url`` (``etcd://host:port[,host:port...]``), once
    one of its endpoints has answered; :class:`CoordinatorUnavailable` after
    ``request_timeout_s`` when none does."""
    parsed = parse_coordinator_url(url) if isinstance(url, str) else url
    coordinator = EtcdCoordinator(parsed, request_timeout_s=request_timeout_s)
    try:
        await coordinator.ping()
    except BaseException:
        await coordinator.close()
        raise
    return coordinator


def _kv(kv: Any) -> KeyValue:
    return KeyValue(
        key=kv.key.decode(),
        value=bytes(kv.value),
        create_revision=int(kv.create_revision),
        mod_revision=int(kv.mod_revision),
        lease_id=int(kv.lease),
    )


def _lease_id(lease: Lease | None) -> int:
    return 0 if lease is None else lease.id


def _describe(error: BaseException, budget_s: float) -> str:
    if isinstance(error, aetcd.exceptions.ConnectionTimeoutError):
        return f"no answer within {budget_s:g} s"
    if isinstance(error, aetcd.exceptions.WatchTimeoutError):
        return f"the watch was not confirmed within {budget_s:g} s"
    text = str(error)
    if "Connection refused" in text:
        return "connection refused"
    return text
