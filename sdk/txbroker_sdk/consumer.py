"""A group consumer: heartbeats, long-poll pulls, per-message ack, offset commits.

    async with Consumer(client, "billing", "orders") as consumer:
        async for msg in consumer:
            handle(msg.body)
            msg.ack()

Messages of one queue arrive in queue order. The committed offset is the lowest not yet
acknowledged, so a crash or a rebalance redelivers what was in flight, never skips a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

from txbroker.errors import StaleGeneration, TxbError
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    AckRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaveRequest,
    NackRequest,
    NackResponse,
    PulledMessage,
    PullRequest,
    PullResponse,
    QueuePosition,
)
from txbroker_sdk.client import Client

if TYPE_CHECKING:
    from txbroker_sdk.cluster import ClusterClient, Route

__all__ = ["ConsumedMessage", "Consumer"]

# A third of the broker's default 10 s session timeout, so two heartbeats may be lost in a row.
HEARTBEAT_INTERVAL_S: Final = 3.0
COMMIT_INTERVAL_S: Final = 1.0
# Over broker groups: how often the topic's route is looked at for groups to join and masters
# that moved (a failed pull has it looked at at once).
ROUTE_CHECK_S: Final = 5.0
# A consumer left at a group's old master: how long its last pull and its goodbye may take.
RETIRE_TIMEOUT_S: Final = 5.0
# A fetch over broker groups none of which has a master now waits this long (at most) for
# an election before it answers with nothing.
NO_MASTER_WAIT_S: Final = 1.0


class ConsumedMessage:
    __slots__ = ("_consumer", "_tenure", "acked", "msg")

    def __init__(self, consumer: Consumer, msg: PulledMessage, tenure: int) -> None:
        self._consumer = consumer
        self._tenure = tenure  # which tenure of its queue delivered it
        self.msg = msg
        self.acked = False

    @property
    def body(self) -> bytes:
        return self.msg.body

    @property
    def reconsume_count(self) -> int:
        return self.msg.reconsume_count

    def ack(self) -> None:
        if not self.acked:
            self.acked = True
            self._consumer._acked(self)

    async def nack(self) -> NackResponse:
        """Hand the message back: the broker redelivers it to this group after a growing delay,
        or moves it to the group's dead-letter topic past the maximum. Then it counts as done."""
        c = self._consumer
        req = NackRequest(
            c.group,
            c.topic,
            c.member_id,
            c.generation,  # the queue may have survived a rebalance: the broker checks it
            self.msg.queue_id,
            self.msg.queue_offset,
        )
        res: NackResponse = await c._client.request(Opcode.NACK, req)
        self.ack()
        return res


class Consumer:
    """One member of a consumer group, on one broker or across a cluster's broker groups.

    Given a :class:`~txbroker_sdk.cluster.ClusterClient` (NameServers), the consumer is one
    consumer per broker group holding the topic's queues, each on that group's master, pulled
    together: ``fetch`` answers with whichever has messages first. The route is looked at every
    ``ROUTE_CHECK_S`` and after a group's pull fails: a group added is joined, and a group whose
    master changed is joined afresh at the new master, from the offsets committed there (never
    from positions read at the old one, whose queue offsets may hold other records there).
    """

    def __init__(
        self,
        client: Client,
        group: str,
        topic: str,
        *,
        member_id: str | None = None,
        mode: str = "clustering",
        start: str = "earliest",
        start_timestamp_ms: int = 0,
        max_messages: int = 32,
        hold_ms: int = 30_000,
        with_retries: bool = True,
    ) -> None:
        self._client = client
        self.group = group
        self.topic = topic
        self.member_id = member_id or uuid.uuid4().hex
        self._mode = mode
        self._start = start
        self._start_ts = start_timestamp_ms
        self._max = max_messages
        self._hold_ms = hold_ms
        self.generation = 0
        self.queues: list[int] = []
        self._outstanding: dict[int, set[int]] = {}  # queue -> delivered, not acked offsets
        self._next: dict[int, int] = {}  # queue -> offset after the last delivered
        self._dirty: set[int] = set()
        self._tenure: dict[int, int] = {}  # queue -> how many times we lost it
        self._buffer: list[ConsumedMessage] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        # Nacked messages come back through the group's retry topic; consume it alongside.
        self._retry: Consumer | None = None
        self._with_retries = with_retries
        self._pulls: dict[Consumer, asyncio.Task[list[ConsumedMessage]]] = {}
        # Over broker groups (a ClusterClient): one consumer per group, by group name, and the
        # master address each one consumes at.
        self._parts: dict[str, Consumer] | None = None
        self._masters: dict[str, str] = {}
        self._reroute = False  # a group's pull failed: look at the route before the next
        self._carried: list[ConsumedMessage] = []  # read by a consumer left at an old master
        self._retiring: set[asyncio.Task[None]] = set()
        self._routing = asyncio.Lock()  # one look at the route at a time: one consumer a group
        # A source's failure that came with another's messages: raised by the next fetch.
        self._failure: BaseException | None = None

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def assignment(self) -> str:
        """The queues this member holds, for a log line: ``0,1,2,3``, or over broker groups
        ``g1: 0,1; g2: 0,1`` (each group's own queue ids); ``none`` while it holds none."""
        if self._parts is not None:
            held = [f"{g}: {_ids(p.queues)}" for g, p in self._parts.items() if p.queues]
            return "; ".join(held) or "none"
        return _ids(self.queues) or "none"

    async def start(self) -> None:
        from txbroker_sdk.cluster import ClusterClient

        if isinstance(self._client, ClusterClient):
            self._parts = {}
            await self._follow_route()
            self._tasks = [asyncio.create_task(self._every(ROUTE_CHECK_S, self._follow_route))]
            return
        await self._heartbeat()
        if self._with_retries and not self.topic.startswith("%"):
            self._retry = Consumer(
                self._client,
                self.group,
                f"%RETRY%{self.group}",
                member_id=self.member_id,
                mode=self._mode,
                max_messages=self._max,
                hold_ms=self._hold_ms,
                with_retries=False,
            )
            await self._retry.start()
        self._tasks = [
            asyncio.create_task(self._every(HEARTBEAT_INTERVAL_S, self._heartbeat)),
            asyncio.create_task(self._every(COMMIT_INTERVAL_S, self._commit_own)),
        ]

    async def _follow_route(self, *, refresh: bool = False) -> None:
        """Consume at each group's master in the topic's route: join a group not joined yet,
        and join afresh a group whose master is another broker now (a failover). A group with
        no master at the moment keeps its consumer, whose pulls fail until one is elected."""
        from txbroker_sdk.cluster import ClusterClient

        client = self._client
        assert isinstance(client, ClusterClient)
        async with self._routing:
            await self._follow_groups(client, await client.route(self.topic, refresh=refresh))

    async def _follow_groups(self, client: ClusterClient, route: Route) -> None:
        assert self._parts is not None
        for g in route.groups:
            if g.master is None or self._masters.get(g.group) == g.master:
                continue
            part = Consumer(
                client.broker(g.master),
                self.group,
                self.topic,
                member_id=self.member_id,
                mode=self._mode,
                start=self._start,
                start_timestamp_ms=self._start_ts,
                max_messages=self._max,
                hold_ms=self._hold_ms,
                with_retries=self._with_retries,
            )
            await part.start()
            old = self._parts.get(g.group)
            self._parts[g.group] = part
            self._masters[g.group] = g.master
            if old is not None:
                self._retire(old)

    def _retire(self, part: Consumer) -> None:
        """Leave ``part`` (at a group's old master): what its last pull brings is still handed
        out, then it closes. What it delivered and was not committed there comes again from
        the new master (at least once; an inbox drops the repeat)."""
        pull = self._pulls.pop(part, None)

        async def retire() -> None:
            try:
                if pull is not None:
                    done, _ = await asyncio.wait((pull,), timeout=RETIRE_TIMEOUT_S)
                    if pull in done and not pull.cancelled() and pull.exception() is None:
                        self._carried.extend(pull.result())
                    else:
                        pull.cancel()
                async with asyncio.timeout(RETIRE_TIMEOUT_S):
                    await part.close()
            except (TxbError, TimeoutError):
                pass  # the old master is gone or refuses: nothing of it is needed any more

        task = asyncio.create_task(retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for t in [*self._tasks, *self._pulls.values()]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._pulls.values(), return_exceptions=True)
        if self._parts is not None:
            await asyncio.gather(*(p.close() for p in self._parts.values()), *self._retiring)
            return
        if self._retry is not None:
            await self._retry.close()
        with contextlib.suppress(Exception):
            await self.commit()
            await self._client.request(
                Opcode.LEAVE, LeaveRequest(self.group, self.topic, self.member_id)
            )

    async def _every(self, interval: float, fn: object) -> None:
        assert callable(fn)
        while True:
            await asyncio.sleep(interval)
            # A broker restart or a rebalance must not end the heartbeats: the next round
            # reconnects (the client backs off) or re-learns the assignment.
            with contextlib.suppress(TxbError):
                await fn()

    async def _heartbeat(self) -> None:
        req = HeartbeatRequest(
            self.group, self.topic, self.member_id, self._mode, self._start, self._start_ts
        )
        res: HeartbeatResponse = await self._client.request(Opcode.HEARTBEAT, req)
        if res.generation != self.generation:
            self.generation = res.generation
            # Queues we lost are someone else's now: what we had in flight there is redelivered
            # to them, so forget our position, pending commit and unacked offsets, and start a
            # new tenure so a late ack of an old delivery cannot count if the queue comes back.
            kept = set(res.queues)
            for q in (set(self._outstanding) | set(self._next) | self._dirty) - kept:
                self._outstanding.pop(q, None)
                self._next.pop(q, None)
                self._dirty.discard(q)
                self._tenure[q] = self._tenure.get(q, 0) + 1
            self._buffer = [
                m for m in self._buffer if m._consumer is not self or m.msg.queue_id in kept
            ]
        self.queues = list(res.queues)

    async def fetch(self, timeout_ms: int | None = None) -> list[ConsumedMessage]:
        """Messages from the topic or the group's retry topic, whichever has some first
        (long-polling both up to ``timeout_ms``); [] when nothing arrived. Over broker groups,
        from whichever group has some first."""
        if self._retry is None and self._parts is None:
            return await self._fetch_own(timeout_ms)
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        if self._reroute:
            self._reroute = False
            await self._follow_route(refresh=True)
        hold_ms = self._hold_ms if timeout_ms is None else timeout_ms
        deadline = time.monotonic() + hold_ms / 1000
        while True:
            out, self._carried = self._carried, []
            left_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            sources = list(self._parts.values()) if self._parts is not None else [self, self._retry]
            for source in sources:
                if source is not None and source not in self._pulls:
                    fetch = source._fetch_own if source is self else source.fetch
                    self._pulls[source] = asyncio.create_task(fetch(left_ms))
            if not self._pulls and not out:
                # No group of the route has a master now: the route is looked at again soon.
                await asyncio.sleep(min(left_ms / 1000, NO_MASTER_WAIT_S))
                return []
            if not out:
                await asyncio.wait(self._pulls.values(), return_when=asyncio.FIRST_COMPLETED)
            # Every finished pull is taken, not only the one that ended the wait: its messages
            # are outstanding (they hold back their queue's commit) and must be handed out.
            failures: list[BaseException] = []
            for source, task in list(self._pulls.items()):
                if not task.done():
                    continue
                del self._pulls[source]
                if task.cancelled():
                    continue
                error = task.exception()
                if error is None:
                    out.extend(task.result())
                    continue
                failures.append(error)
                if self._parts is not None:
                    self._reroute = True  # its master may have moved
            if failures:
                if not out:
                    raise failures[0]
                self._failure = failures[0]  # the messages first; the failure is not lost
                return out
            # An empty answer from one source must not end the wait for the other.
            if out or time.monotonic() >= deadline:
                return out

    async def _fetch_own(self, timeout_ms: int | None = None) -> list[ConsumedMessage]:
        hold = self._hold_ms if timeout_ms is None else timeout_ms
        generation = self.generation
        positions = [QueuePosition(q, off) for q, off in self._next.items() if q in self.queues]
        req = PullRequest(
            self.group,
            self.topic,
            self.member_id,
            generation,
            self._max,
            hold,
            positions=positions,
        )
        try:
            res: PullResponse = await self._client.request(
                Opcode.PULL, req, timeout_s=hold / 1000 + 10
            )
        except StaleGeneration:
            await self._heartbeat()
            return []
        if generation != self.generation:
            return []  # a rebalance happened meanwhile: these may not be ours any more
        out = []
        for m in res.messages:
            self._outstanding.setdefault(m.queue_id, set()).add(m.queue_offset)
            out.append(ConsumedMessage(self, m, self._tenure.get(m.queue_id, 0)))
        for p in res.next_offsets:
            # Our position moves only now that the answer is here (a lost answer is re-read).
            if p.offset != self._next.get(p.queue_id):
                self._next[p.queue_id] = p.offset
                self._dirty.add(p.queue_id)  # filtered-out messages count as consumed too
        return out

    def __aiter__(self) -> AsyncIterator[ConsumedMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[ConsumedMessage]:
        while not self._closed:
            if not self._buffer:
                self._buffer = await self.fetch()
                continue
            yield self._buffer.pop(0)

    def _acked(self, m: ConsumedMessage) -> None:
        if m._tenure != self._tenure.get(m.msg.queue_id, 0):
            return  # its queue was taken away since: the new owner delivers it again
        outstanding = self._outstanding.get(m.msg.queue_id)
        if outstanding is not None:
            outstanding.discard(m.msg.queue_offset)
            self._dirty.add(m.msg.queue_id)

    async def commit(self) -> None:
        """Commit, per queue, the lowest offset not yet acknowledged (retry topic included)."""
        if self._parts is not None:
            await asyncio.gather(*(p.commit() for p in self._parts.values()))
            return
        await self._commit_own()
        if self._retry is not None:
            await self._retry.commit()

    async def _commit_own(self) -> None:
        if not self._dirty:
            return
        positions = []
        for q in sorted(self._dirty):
            pending = self._outstanding.get(q)
            if q not in self._next:
                continue
            positions.append(QueuePosition(q, min(pending) if pending else self._next[q]))
        self._dirty.clear()
        if positions:
            req = AckRequest(self.group, self.topic, self.member_id, self.generation, positions)
            try:
                await self._client.request(Opcode.ACK, req)
            except StaleGeneration:
                await self._heartbeat()


def _ids(queues: list[int]) -> str:
    return ",".join(str(q) for q in sorted(queues))
