"""A client of a cluster of broker groups, found through NameServers (docs/cluster.md, "Clients").

    async with await Client.connect("txbns://10.0.0.1:9878,10.0.0.2:9878") as client:
        await client.send("orders", b"...", key="order-42")

``txbnss://`` reaches NameServers over TLS. The token and the TLS files go to every connection:
the NameServers and each group's brokers (TLS files to those at ``txbs://`` addresses).

A :class:`ClusterClient` is a ``Client`` whose requests are routed: each to the master of the
group holding the queue it picks, with routes from any NameServer that answers, kept for
``refresh_s`` and fetched again after a routing error. Operator requests are routed too: a
transaction's show and resolve to the master holding it, consumer groups' offsets and open
transactions asked of every group's master and put together, a topic's deletion to every group
its route names. Topic listing and dead letters need a broker's own address.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import google_crc32c
import msgspec

from txbroker.errors import (
    BadRequest,
    InvalidArgument,
    NoRoute,
    NotFound,
    NotMaster,
    TopicExists,
    TransactionNotFound,
    Unauthenticated,
)
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    Empty,
    GroupInfo,
    GroupRoute,
    GroupsRequest,
    GroupsResponse,
    RouteRequest,
    RouteResponse,
    SendBatchRequest,
    SendBatchResponse,
    SendReceipt,
    SendRequest,
    TopicInfo,
    TopicName,
    TxInfo,
    TxListRequest,
    TxListResponse,
    TxPrepareRequest,
    TxPrepareResponse,
)
from txbroker_sdk.client import Client
from txbroker_sdk.connection import DEFAULT_CONNECT_DEADLINE_S, DEFAULT_KEEPALIVE_S
from txbroker_sdk.errors import BrokerUnreachable, ConnectionClosed, RequestTimeout
from txbroker_sdk.requests import is_nameserver_url, parse_nameserver_url, uses_tls

__all__ = ["ROUTE_REFRESH_S", "ClusterClient", "Route", "client_for"]

log = logging.getLogger(__name__)

# How long a route is used before it is fetched again: a route changes when an operator moves
# queues (rare) and a master changes on failover (the send fails and the route is fetched at
# once), so this only bounds how long a quiet change goes unnoticed.
ROUTE_REFRESH_S: Final = 30.0
# A NameServer or a group's broker that went away is tried again for this long before the next
# NameServer is asked or the route fetched again: another may answer at once.
RECONNECT_S: Final = 1.0
# Transactions prepared through this client, remembered to end them at their broker; an older
# one is looked for on every group's master.
TX_REMEMBERED: Final = 10_000


# No answer, or no connection any more, after the request was sent: it may have been stored, so
# it is not sent again here, but the route may be stale (a master cut off answers nothing while
# its group elects another), so the next request fetches it again.
_OUTCOME_UNKNOWN: Final = (ConnectionClosed, RequestTimeout)

# Refusals that say the route was wrong, with nothing stored: the broker is not reachable (the
# request was never sent), the topic or the queue is not there (NOT_FOUND; a queue id beyond
# the group's is a plain INVALID_ARGUMENT), the broker is not its group's master now
# (NOT_MASTER: a failover). Worth one more try on a route fetched again.
_ROUTING_ERRORS: Final = (BrokerUnreachable, NotFound, InvalidArgument, NotMaster)


def _routing_error(e: BaseException) -> bool:
    if isinstance(e, TransactionNotFound):
        return False  # an answer about the transaction, not the route
    if isinstance(e, InvalidArgument):
        return type(e) is InvalidArgument  # not a too-large message, a bad name, a bad body
    return isinstance(e, _ROUTING_ERRORS)


def _global(receipt: SendReceipt, group: GroupRoute) -> SendReceipt:
    """A group's receipt with the topic's (global) queue id instead of the group's own."""
    if 0 <= receipt.queue_id < len(group.queues):
        return msgspec.structs.replace(receipt, queue_id=group.queues[receipt.queue_id])
    return receipt  # -1: a delayed message has no queue yet


@dataclass(frozen=True, slots=True)
class Route:
    """A topic's route as a NameServer gave it, and when it was fetched."""

    topic: str
    queues: int
    groups: tuple[GroupRoute, ...]
    fetched_at_s: float  # time.monotonic()

    def locate(self, queue: int) -> tuple[GroupRoute, int]:
        """The group holding the topic's (global) ``queue``, and the queue's id there."""
        for g in self.groups:
            if queue in g.queues:
                return g, g.queues.index(queue)
        raise InvalidArgument(f"topic {self.topic!r} has no queue {queue} (0..{self.queues - 1})")


def client_for(url: str, **options: Any) -> Client:
    """A client for ``url`` that connects on its first request, for a program that must start
    while the broker is away: a :class:`ClusterClient` for ``txbns://``, else a ``Client``.
    ``options`` are ``Client``'s. (``await Client.connect(url)`` connects now.)"""
    if is_nameserver_url(url):
        return ClusterClient(url, **options)
    return Client(url, **options)


class ClusterClient(Client):
    """A :class:`Client` over broker groups, through NameServers.
    Made by ``Client.connect("txbns://...")``, or ``ClusterClient("txbns://...")`` to connect
    on first use (:func:`client_for` for either kind of URL); the options are those of
    ``Client`` and apply to every connection it opens, plus ``refresh_s``: the token to the
    NameServers and brokers, the TLS files to those that serve TLS (NameServers at
    ``txbnss://``, brokers that registered a ``txbs://`` address), so TLS brokers behind plain
    ``txbns://`` NameServers work too.

    A send picks the topic's queue as a single broker does (the key's CRC32C modulo the topic's
    queues over all groups, else round-robin), finds the group holding that queue in the topic's
    route, and sends to that group's master with the queue's id there; a prepared transaction
    is ended at the broker that holds it. Routes come from any NameServer that answers (in the
    URL's order, moving on when one does not), are kept for ``refresh_s`` (30 s) and fetched
    again at once after a routing error: the group's broker unreachable before the request was
    sent, the topic or the queue unknown there. A request whose connection broke after it was
    sent, or that got no answer within its timeout (``timeout_s``: a master cut off by a
    partition answers nothing while its group elects another), is not sent again (it may have
    been stored): it fails as with one broker, and the route is fetched again for the next.

    A :class:`~txbroker_sdk.consumer.Consumer` given a ``ClusterClient`` joins the consumer
    group on every group's master holding the topic's queues and pulls from all of them.

    ``submit`` and ``post`` (what ``TxPublisher`` pipelines) are routed too, each as a task
    rather than a frame written in the caller's turn. A batch is split by group (all or nothing
    within each group, not across groups).
    """

    def __init__(
        self,
        url: str,
        *,
        auth_token: str | None = None,
        timeout_s: float = 10.0,
        reconnect_s: float = 30.0,
        connect_deadline_s: float = DEFAULT_CONNECT_DEADLINE_S,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        tls_ca: str | Path | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        refresh_s: float = ROUTE_REFRESH_S,
    ) -> None:
        nameservers = parse_nameserver_url(url)
        # The base connection is never dialed: every request goes to a NameServer or a broker.
        base = "txb://" + nameservers[0].partition("://")[2]
        super().__init__(base, timeout_s=timeout_s, connect_deadline_s=0)
        self.url = url
        self.refresh_s = refresh_s
        self._options: dict[str, Any] = {
            "auth_token": auth_token,
            "timeout_s": timeout_s,
            "reconnect_s": min(reconnect_s, RECONNECT_S),
            "connect_deadline_s": min(connect_deadline_s, RECONNECT_S),
            "keepalive_s": keepalive_s,
        }
        self._tls: dict[str, Any] = {"tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key}
        self._first_deadline_s = connect_deadline_s
        self._nameservers = [self._client(a) for a in nameservers]
        self._current = 0  # the NameServer that answered last
        self._brokers: dict[str, Client] = {}  # by address
        self._routes: dict[str, Route] = {}
        # id -> (group, broker that prepared it)
        self._txs: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        self._rr = itertools.count()
        self.route_fetches = 0

    async def _dial(self, deadline_s: float) -> None:
        """``connect()``: a NameServer answers (each tried in turn, for up to ``deadline_s``)."""
        deadline = time.monotonic() + deadline_s
        while True:  # connect() closes this client if it fails
            try:
                await self._ask(RouteRequest(""))
                return
            except BrokerUnreachable:
                if time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.1)  # a back-off between rounds, not a synchronisation

    @property
    def connected(self) -> bool:
        return any(ns.connected for ns in self._nameservers)

    async def close(self) -> None:
        """Wait (at most ``timeout_s``) for what ``submit``/``post`` sent, then close every
        connection."""
        await self.drain(self._timeout_s)
        clients = [*self._nameservers, *self._brokers.values()]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        await super().close()

    # Routes.

    async def _ask(self, req: RouteRequest) -> RouteResponse:
        """ROUTE from the NameServer that answered last, else the next ones in turn."""
        errors = []
        n = len(self._nameservers)
        for i in range(n):
            k = (self._current + i) % n
            try:
                res: RouteResponse = await self._nameservers[k].request(Opcode.ROUTE, req)
            except _OUTCOME_UNKNOWN as e:  # BrokerUnreachable too: asked again below
                errors.append(f"{self._nameservers[k].url}: {e}")
                continue
            except Unauthenticated as e:
                raise Unauthenticated(
                    f"the NameServer at {self._nameservers[k].url} refused this client: {e} "
                    "(give the token its --auth-token names: auth_token=, or --auth-token / "
                    "TXB_AUTH_TOKEN for the CLI)"
                ) from e
            except BadRequest as e:  # a broker answers "opcode 70 is not served"
                raise InvalidArgument(
                    f"{self._nameservers[k].url} is not a NameServer ({e}); a broker's address "
                    "is txb://host:port"
                ) from e
            self._current = k
            return res
        raise BrokerUnreachable(f"no NameServer of {self.url} answered: {'; '.join(errors)}")

    async def route(self, topic: str, *, refresh: bool = False) -> Route:
        """``topic``'s route: the one kept, unless older than ``refresh_s`` or ``refresh``."""
        kept = self._routes.get(topic)
        fresh = kept is not None and time.monotonic() - kept.fetched_at_s < self.refresh_s
        if kept is not None and fresh and not refresh:
            return kept
        res = await self._ask(RouteRequest(topic))
        self.route_fetches += 1
        route = Route(res.topic, res.queues, tuple(res.groups), time.monotonic())
        self._routes[topic] = route
        return route

    async def masters(self) -> dict[str, str]:
        """Every group with a registered broker, and its master's address ("" for none now)."""
        res = await self._ask(RouteRequest(""))
        return {g.group: g.master or "" for g in res.groups}

    def broker(self, address: str) -> Client:
        """The connection to the broker at ``address`` (made on first use, then kept)."""
        client = self._brokers.get(address)
        if client is None:
            client = self._brokers[address] = self._client(address)
        return client

    def _client(self, address: str) -> Client:
        """A client of one NameServer or broker: the TLS files for a ``txbs://`` one only."""
        tls = self._tls if uses_tls(address) else {}
        return Client(address, **self._options, **tls)

    # Requests.

    async def request(self, opcode: Opcode, body: Any, *, timeout_s: float | None = None) -> Any:
        if opcode in (Opcode.SEND, Opcode.TX_PREPARE):
            return await self._routed(opcode, body, timeout_s)
        if opcode == Opcode.SEND_BATCH:
            return await self._send_batch(body, timeout_s)
        if opcode in (Opcode.TX_END, Opcode.TX_SHOW, Opcode.TX_RESOLVE):
            return await self._by_transaction(opcode, body, timeout_s)
        if opcode == Opcode.PING:
            await self._ask(RouteRequest(""))
            return Empty()
        if opcode == Opcode.ROUTE:
            return await self._ask(body)
        if opcode == Opcode.OFFSETS:
            return await self._groups(body, timeout_s)
        if opcode == Opcode.TX_LIST:
            return await self._transactions(body, timeout_s)
        if opcode == Opcode.TOPIC_DELETE:
            return await self._delete_topic(body, timeout_s)
        if opcode in (Opcode.TOPIC_DESCRIBE, Opcode.TOPIC_CREATE):
            route = await self.route(body.topic, refresh=True)  # NoRoute: not created
            if opcode == Opcode.TOPIC_CREATE:  # create_topic(exist_ok=True) describes it then
                raise TopicExists(f"topic {body.topic!r} is routed over groups already")
            return TopicInfo(route.topic, route.queues)
        raise InvalidArgument(
            f"{opcode.name} is not routed through NameServers yet: connect to a group's broker "
            "(txb://host:port) for it"
        )

    def _choose(self, route: Route, req: SendRequest | TxPrepareRequest) -> tuple[GroupRoute, int]:
        queue_id = getattr(req, "queue_id", None)
        if queue_id is not None:
            queue = queue_id
        elif req.key is not None:  # as the broker does (server/producer.py): same key, same queue
            queue = google_crc32c.value(req.key.encode()) % route.queues
        else:
            queue = next(self._rr) % route.queues
        return route.locate(queue)

    async def _routed(self, opcode: Opcode, req: Any, timeout_s: float | None) -> Any:
        for attempt in (1, 2):
            route = await self.route(req.topic, refresh=attempt > 1)
            group, local = self._choose(route, req)
            if group.master is None:
                if attempt == 1:
                    continue
                raise NoRoute(f"group {group.group} of topic {req.topic!r} has no master now")
            # TX_PREPARE has no queue field: the group's broker chooses among its queues by key.
            body = msgspec.structs.replace(req, queue_id=local) if opcode == Opcode.SEND else req
            try:
                res = await self.broker(group.master).request(opcode, body, timeout_s=timeout_s)
            except _ROUTING_ERRORS as e:
                # Refused or never sent: nothing was stored, so a fresh route may be tried.
                if attempt == 2 or not _routing_error(e):
                    raise
                log.info("to %s of %s: %s; fetching the route again", group.group, req.topic, e)
                continue
            except _OUTCOME_UNKNOWN:
                self._routes.pop(req.topic, None)  # may have been stored: not resent
                raise
            if isinstance(res, SendReceipt):
                return _global(res, group)
            if isinstance(res, TxPrepareResponse):
                self._remember(res.tx_id, group.group, group.master)
            return res
        raise AssertionError("unreachable")

    async def _send_batch(
        self, req: SendBatchRequest, timeout_s: float | None
    ) -> SendBatchResponse:
        """Split by group, the parts sent at once (each all or nothing, not the whole); a part
        refused by a routing error is routed again once."""
        receipts: dict[int, SendReceipt] = {}
        pending = list(enumerate(req.messages))
        for attempt in (1, 2):
            if attempt > 1:
                for _, m in pending:
                    self._routes.pop(m.topic, None)
            parts: dict[str, list[tuple[int, SendRequest, GroupRoute]]] = {}
            for i, m in pending:
                group, local = self._choose(await self.route(m.topic), m)
                if group.master is None:
                    raise NoRoute(f"group {group.group} of topic {m.topic!r} has no master now")
                placed = msgspec.structs.replace(m, queue_id=local)
                parts.setdefault(group.master, []).append((i, placed, group))
            results = await asyncio.gather(
                *(
                    self.broker(address).request(
                        Opcode.SEND_BATCH,
                        SendBatchRequest([m for _, m, _ in items]),
                        timeout_s=timeout_s,
                    )
                    for address, items in parts.items()
                ),
                return_exceptions=True,
            )
            pending = []
            for items, res in zip(parts.values(), results, strict=True):
                if isinstance(res, _OUTCOME_UNKNOWN):
                    for _, m, _ in items:  # may have been stored: not resent
                        self._routes.pop(m.topic, None)
                if isinstance(res, BaseException):
                    if attempt == 2 or not _routing_error(res):
                        raise res
                    pending.extend((i, req.messages[i]) for i, _, _ in items)
                    continue
                for (i, _, group), r in zip(items, res.receipts, strict=True):
                    receipts[i] = _global(r, group)
            if not pending:
                break
        return SendBatchResponse([receipts[i] for i in range(len(req.messages))])

    # Operator requests: asked of every group's master, the answers put together.

    async def _each_master(
        self, opcode: Opcode, body: Any, timeout_s: float | None
    ) -> list[tuple[str, Any]]:
        """``body`` asked of every group's master at once: (group, answer) each. A group
        without a master now fails the whole: a listing or a deletion with a group missing
        would read as complete."""
        masters = await self.masters()
        missing = sorted(g for g, a in masters.items() if not a)
        if missing:
            raise NoRoute(f"group(s) {', '.join(missing)} have no master now: try again shortly")
        answers = await asyncio.gather(
            *(self.broker(a).request(opcode, body, timeout_s=timeout_s) for a in masters.values())
        )
        return list(zip(masters, answers, strict=True))

    async def _global_queues(self, topic: str, group: str) -> list[int] | None:
        """The topic's (global) queue ids of ``group``'s local ones; None: not routed there
        (a topic of that group's own)."""
        try:
            route = await self.route(topic)
        except NoRoute:
            return None
        for g in route.groups:
            if g.group == group:
                return list(g.queues)
        return None

    async def _groups(self, req: GroupsRequest, timeout_s: float | None) -> GroupsResponse:
        """OFFSETS over every group: a consumer group's share on each master is one group and
        topic here, its queues numbered as the topic's, its lag and rate summed."""
        merged: dict[tuple[str, str], GroupInfo] = {}
        for group, res in await self._each_master(Opcode.OFFSETS, req, timeout_s):
            for info in res.groups:
                ids = await self._global_queues(info.topic, group)
                queues = [
                    msgspec.structs.replace(q, queue=ids[q.queue])
                    if ids is not None and 0 <= q.queue < len(ids)
                    else q
                    for q in info.queues
                ]
                seen = merged.get((info.group, info.topic))
                if seen is None:
                    merged[(info.group, info.topic)] = msgspec.structs.replace(info, queues=queues)
                    continue
                rates = [r for r in (seen.rate_per_s, info.rate_per_s) if r is not None]
                merged[(info.group, info.topic)] = GroupInfo(
                    info.group,
                    info.topic,
                    sorted({*seen.members, *info.members}),
                    sorted([*seen.queues, *queues], key=lambda q: q.queue),
                    seen.lag + info.lag,
                    sum(rates) if rates else None,
                )
        return GroupsResponse(sorted(merged.values(), key=lambda g: (g.group, g.topic)))

    async def _transactions(self, req: TxListRequest, timeout_s: float | None) -> TxListResponse:
        """TX_LIST over every group: the oldest ``limit`` of all, queues numbered as the
        topic's, the total summed."""
        found: list[TxInfo] = []
        total = 0
        for group, res in await self._each_master(Opcode.TX_LIST, req, timeout_s):
            total += res.total
            for t in res.transactions:
                ids = await self._global_queues(t.topic, group)
                if ids is not None and 0 <= t.queue_id < len(ids):
                    t = msgspec.structs.replace(t, queue_id=ids[t.queue_id])
                found.append(t)
        found.sort(key=lambda t: (t.created_ms, t.tx_id))
        return TxListResponse(found[: req.limit], total)

    async def _delete_topic(self, req: TopicName, timeout_s: float | None) -> Empty:
        """TOPIC_DELETE at the master of every group the topic's route names (NO_ROUTE: not
        routed). A group that no longer holds it (a deletion run again) is passed over; the
        route itself stays in etcd: ``txbroker topic delete --coordinator`` removes it."""
        route = await self.route(req.topic, refresh=True)
        masterless = [g.group for g in route.groups if g.master is None]
        if masterless:
            raise NoRoute(
                f"group(s) {', '.join(masterless)} of topic {req.topic!r} have no master now"
            )
        results = await asyncio.gather(
            *(
                self.broker(g.master).request(Opcode.TOPIC_DELETE, req, timeout_s=timeout_s)
                for g in route.groups
                if g.master is not None
            ),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        for r in failed:
            if not isinstance(r, NotFound):
                raise r
        if failed and len(failed) == len(results):
            raise failed[0]  # held by no group: not there to delete
        self._routes.pop(req.topic, None)
        return Empty()

    def _remember(self, tx_id: str, group: str, address: str) -> None:
        self._txs[tx_id] = (group, address)
        if len(self._txs) > TX_REMEMBERED:
            self._txs.popitem(last=False)

    async def _by_transaction(self, opcode: Opcode, req: Any, timeout_s: float | None) -> Any:
        """At the broker that prepared it, or its group's master now if that one is gone or
        no longer master (a failover: the new master recovered the transaction from the log);
        one prepared elsewhere is looked for on every group's master."""
        remembered = self._txs.get(req.tx_id)
        if remembered is not None:
            group, address = remembered
            try:
                return await self.broker(address).request(opcode, req, timeout_s=timeout_s)
            except (*_ROUTING_ERRORS, *_OUTCOME_UNKNOWN) as e:
                # Ending or showing a transaction again is harmless (the same decision twice
                # is answered as a duplicate): after a lost answer too, ask the master now.
                moved = _routing_error(e) or isinstance(e, _OUTCOME_UNKNOWN)
                current = (await self.masters()).get(group) if moved else None
                if not current or current == address:
                    raise
                log.info("transaction %s: %s; asking %s's master now", req.tx_id, e, group)
                self._remember(req.tx_id, group, current)
                return await self.broker(current).request(opcode, req, timeout_s=timeout_s)
        for group, a in (await self.masters()).items():
            if not a:
                continue
            try:
                res = await self.broker(a).request(opcode, req, timeout_s=timeout_s)
            except TransactionNotFound:
                continue
            self._remember(req.tx_id, group, a)
            return res
        raise TransactionNotFound(f"transaction {req.tx_id} is on no group's master")
