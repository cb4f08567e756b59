"""Receiving by receipt: the broker joins a consumer group on behalf of stateless clients.

A client that receives over HTTP holds no connection and no read position. The first time one
receives from a (group, topic), the broker joins the group as the member ``%http`` of the topic
and of the group's retry topic, with the HEARTBEAT a TCP consumer sends, and reads the queues
the group's allocation gives that member with the same PULL. TCP consumers of the group hold
the other queues, so no message is read by both. Each message handed out gets a receipt and is
remembered here while it is in flight; a queue's committed offset moves only up to the lowest
offset still in flight, never past it. A restart forgets what was in flight, and the queue is
read again from its committed offset: nothing un-acknowledged is lost.

A message not acknowledged within its invisibility, or refused, goes back through the NACK an
SDK consumer sends (``retry.py``): a copy with its reconsume count raised comes again through
the group's retry topic, or, past the group's maximum, goes to its dead-letter topic. The retry
topic is the group's, read once for all the group's topics; a retry read for one topic's
receivers waits for a receiver of its own topic.

    receiver = Receiver(tcp_requests(handlers, role), topics)
    receiver.start()
    got = await receiver.receive("billing", "orders", max_messages=10, wait_ms=20_000,
                                 invisible_ms=30_000)
    await receiver.ack("billing", "orders", [r.receipt for r in got])
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from txbroker.errors import (
    InvalidArgument,
    InvalidName,
    NotFound,
    NotMaster,
    StaleGeneration,
    TxbError,
)
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import (
    AckRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    LeaveRequest,
    NackRequest,
    PulledMessage,
    PullRequest,
    PullResponse,
    QueuePosition,
)
from txbroker.protocol.names import validate_topic
from txbroker.server.consumer import MAX_HOLD_MS, MAX_PULL_MESSAGES
from txbroker.server.delay import LEVELS_MS, MAX_DELAY_MS
from txbroker.server.groups import MAX_GROUP_NAME
from txbroker.server.retry import retry_topic
from txbroker.server.topics import TopicRegistry

__all__ = [
    "MAX_INVISIBLE_MS",
    "MAX_RECEIPTS",
    "MAX_RECEIVE",
    "MAX_WAIT_MS",
    "MEMBER_ID",
    "MIN_INVISIBLE_MS",
    "RECEIPT_PATTERN",
    "Received",
    "Receiver",
    "Settled",
]

log = logging.getLogger(__name__)

# The member id the broker joins groups under. The SDK's member ids are hex, so it is no
# client's, and it sorts before them: the broker's share of a group's queues is the first run.
MEMBER_ID: Final = "%http"
MAX_RECEIVE: Final = MAX_PULL_MESSAGES  # messages one receive returns, as one PULL
MAX_WAIT_MS: Final = MAX_HOLD_MS  # a receive long-polls as long as a PULL may
MAX_RECEIPTS: Final = MAX_PULL_MESSAGES  # receipts in one ack, nack or extend: one receive's
# The scheduler's smallest delay level: a redelivery cannot come sooner than it anyway.
MIN_INVISIBLE_MS: Final = LEVELS_MS[0]
# 12 h, RocketMQ's longest invisible duration: longer, and a lost client holds its messages
# (and its queue's committed offset) for half a day.
MAX_INVISIBLE_MS: Final = 12 * 3_600_000
MAX_NACK_DELAY_MS: Final = MAX_DELAY_MS
# What the sweeper waits between looks at invisibility deadlines: a redelivery comes at most
# this late, on top of the scheduler's 100 ms level.
SWEEP_S: Final = 0.05
# How often the broker's memberships are renewed (and a failed hand-back retried): a tenth of
# the default 10 s session, so a rebalance is learnt within a second.
RENEW_S: Final = 1.0
# A (group, topic) nobody received from for this long, with nothing in flight, is left: its
# queues go back to the group's TCP consumers. Long enough that a client receiving between units
# of work keeps its queues rather than rebalance the group at every pause.
IDLE_S: Final = 30.0
# Stale deadlines are dropped once they outnumber the live ones and this many more: below it,
# the heap is small whatever it holds.
COMPACT_MIN: Final = 4096

# A receipt names the source (m: the path's topic, r: the group's retry topic), the queue, the
# offset and the delivery (a random nonce, so a later delivery of the same offset after a
# restart or a rebalance does not take an earlier delivery's receipt).
RECEIPT_PATTERN: Final = r"^[mr]\.[0-9]{1,5}\.[0-9]{1,19}\.[0-9a-f]{16}$"
_RECEIPT: Final = re.compile(RECEIPT_PATTERN)
NONCE_BYTES: Final = 8
assert len(secrets.token_hex(NONCE_BYTES)) == 16, "RECEIPT_PATTERN's nonce width"

# Nonces drawn from the OS at once: one system call per this many receipts (two receives of
# 32), where one per receipt cost as much as the rest of handing the message out.
NONCE_BATCH: Final = 64


def _receipt(kind: str, queue: int, offset: int, nonce: str) -> str:
    """The receipt of a delivery, as RECEIPT_PATTERN reads it (``_find`` splits it apart)."""
    return f"{kind}.{queue}.{offset}.{nonce}"


BrokerCall = Callable[[int, Any], Awaitable[Any]]


class State(enum.Enum):
    """A delivery's states. INVISIBLE: handed out; its receipt acks, nacks or extends it.
    ACKED: acknowledged, gone from the in-flight table (a deadline still naming it skips it).
    HANDING_BACK: not acked in time, or nacked; its receipt is stale, and it is gone once the
    NACK's copy is written. WAITING: a retry copy read for the receivers of another of the
    group's topics, kept until a receiver of its own topic takes it."""

    WAITING = "waiting"
    INVISIBLE = "invisible"
    ACKED = "acked"
    HANDING_BACK = "handing back"

    # Hashed by identity, as its members compare: Enum's own hash is Python code, run twice
    # on every move of every message handed out.
    __hash__ = object.__hash__


_MOVES: Final = {
    State.WAITING: {State.INVISIBLE},
    State.INVISIBLE: {State.ACKED, State.HANDING_BACK},
    State.ACKED: set[State](),
    State.HANDING_BACK: set[State](),
}


@dataclass(slots=True)
class _Delivery:
    message: PulledMessage | None  # kept while WAITING only: a client holds it once handed out
    state: State
    receipt: str = ""
    deadline: float = 0.0  # monotonic; past it, an invisible message is handed back
    delay_ms: int = 0  # handing back: when the copy is due (-1: the group's retry ladder)
    busy: bool = False  # a NACK for it is being answered: never two at once (one copy)

    def move(self, to: State) -> None:
        assert to in _MOVES[self.state], f"delivery {self.receipt}: {self.state} -> {to}"
        self.state = to


@dataclass(slots=True)
class _Source:
    """A topic the broker reads as a member of a group: a topic received from, or the group's
    retry topic (one per group, shared by the group's topics)."""

    kind: str  # "m" or "r", as in receipts
    topic: str
    generation: int = 0
    queues: list[int] = field(default_factory=list)
    next: dict[int, int] = field(default_factory=dict)  # queue -> next offset to read
    flight: dict[int, dict[int, _Delivery]] = field(default_factory=dict)  # queue -> offset ->
    dirty: set[int] = field(default_factory=set)  # queues whose commit may move

    def drop(self, queue: int) -> None:
        """Forget a queue taken away: its new owner reads it from the committed offset, so
        what was in flight here is delivered again there and its receipts are stale."""
        self.next.pop(queue, None)
        self.flight.pop(queue, None)
        self.dirty.discard(queue)

    def commit_offset(self, queue: int) -> int | None:
        flying = self.flight.get(queue)
        if flying:
            return min(flying)
        return self.next.get(queue)

    def handed_out(self) -> int:
        """Deliveries a client holds or that are being handed back (not WAITING ones, which
        a rebalance or a restart delivers again from the committed offset)."""
        return sum(
            d.state is not State.WAITING for flying in self.flight.values() for d in flying.values()
        )


@dataclass(slots=True)
class _Lane:
    """A (group, topic) received from: its topic as a source; the group's retry topic is the
    group's, in :attr:`Receiver._retries`."""

    group: str
    main: _Source
    seen: float  # monotonic time of the last receive
    receiving: int = 0  # receives running now
    # Held while a receive reads the lane without waiting: receives at once would each read
    # from the same positions, and all but the first find what they read taken.
    reading: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def topic(self) -> str:
        return self.main.topic


class _Nonces:
    """Receipt nonces, each NONCE_BYTES from the OS's CSPRNG (``secrets``), drawn NONCE_BATCH
    at a time: each is as unguessable as one drawn alone (knowing some of the OS's random bytes
    tells nothing of others), and the batch not yet handed out stays in this process only."""

    __slots__ = ("_at", "_hex")

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def next(self) -> str:
        at = self._at
        if at >= len(self._hex):
            self._hex, at = secrets.token_hex(NONCE_BYTES * NONCE_BATCH), 0
        self._at = at + 2 * NONCE_BYTES
        return self._hex[at : self._at]


class Received(msgspec.Struct, frozen=True):
    """A message handed out, with its receipt and how many times it was delivered. (A
    msgspec Struct: one is made per message handed out, and a frozen dataclass is made field by
    field through object.__setattr__, eight times slower.)"""

    message: PulledMessage
    receipt: str

    @property
    def delivery_attempt(self) -> int:
        return self.message.reconsume_count + 1


class Settled(msgspec.Struct, frozen=True):
    """What an ack, nack or extend did: ``applied`` to the receipts of messages in flight;
    ``stale``: receipts that name no message in flight here any more (acknowledged before,
    handed back, or taken by a rebalance or a restart). Not an error: acknowledging is
    idempotent."""

    applied: list[str]
    stale: list[str]


# A delivery in flight: (queue, offset, the delivery).
_Flying = tuple[int, int, "_Delivery"]
# An invisibility deadline and what was handed out with it: (deadline, sequence, group, source
# kind, source topic, deliveries). One per hand-out (a receive's messages share it) or extend,
# not one per message; each delivery is checked when it comes up (acknowledged, extended,
# handed back or taken by a rebalance since: skipped).
_Deadline = tuple[float, int, str, str, str, list[_Flying]]


class Receiver:
    """The in-flight table of every (group, topic) received from, and the task that hands
    back what was not acknowledged in time and keeps the broker's memberships current.

    ``call`` is the broker's request path (the TCP handler of an opcode): joining, reading,
    committing and handing back go through the same consumer service and retry service a TCP
    consumer's requests do, and a slave refuses them the same way."""

    def __init__(self, call: BrokerCall, topics: TopicRegistry) -> None:
        self._call = call
        self._topics = topics
        self._lanes: dict[tuple[str, str], _Lane] = {}
        self._retries: dict[str, _Source] = {}  # group -> its retry topic, read for all lanes
        self._deadlines: list[_Deadline] = []
        self._seq = 0
        self._scheduled = 0  # deliveries in the deadlines
        self._live_scheduled = 0  # of them, left by the last compaction
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._handing_back: set[asyncio.Task[None]] = set()
        self._nonces = _Nonces()

    # --- lifecycle ---

    def start(self) -> None:
        self._task = asyncio.create_task(self._sweep(), name="txb-receipts")

    async def stop(self) -> None:
        """Answer held receives now (empty) and stop handing back: what is in flight stays
        un-committed, so the next start delivers it again."""
        self._stopping.set()
        tasks = [t for t in (self._task, *self._handing_back) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- the client's requests ---

    async def receive(
        self, group: str, topic: str, *, max_messages: int, wait_ms: int, invisible_ms: int
    ) -> list[Received]:
        """Up to ``max_messages`` from the broker's queues of the topic and the group's retry
        topic, long-polling up to ``wait_ms``; each invisible to other receives for
        ``invisible_ms``."""
        _bounded("max", max_messages, 1, MAX_RECEIVE)
        _bounded("wait_ms", wait_ms, 0, MAX_WAIT_MS)
        _bounded("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        lane = await self._lane(group, topic)
        deadline = time.monotonic() + wait_ms / 1000
        lane.receiving += 1
        try:
            while True:
                until = time.monotonic() + invisible_ms / 1000
                out = self._take_waiting(lane, max_messages, until)
                if not out:
                    out = await self._read(lane, max_messages, deadline, invisible_ms)
                if out or time.monotonic() >= deadline or self._stopping.is_set():
                    return out
        finally:
            lane.receiving -= 1
            lane.seen = time.monotonic()

    async def ack(self, group: str, topic: str, receipts: Sequence[str]) -> Settled:
        self._check(group, topic)
        sources = self._sources(group, topic)
        applied, stale = [], []
        touched: dict[str, _Source] = {}
        for receipt in receipts:
            found = self._find(sources, receipt)
            if found is None:
                stale.append(receipt)
                continue
            source, queue, offset, delivery = found
            delivery.move(State.ACKED)
            del source.flight[queue][offset]
            source.dirty.add(queue)
            touched[source.kind] = source
            applied.append(receipt)
        for source in touched.values():
            await self._commit(group, source)
        return Settled(applied, stale)

    async def nack(
        self, group: str, topic: str, receipts: Sequence[str], delay_ms: int | None
    ) -> Settled:
        """Hand the messages back now: each comes again after ``delay_ms`` (None: the group's
        retry ladder), or goes to the dead-letter topic past the group's maximum."""
        if delay_ms is not None:
            _bounded("delay_ms", delay_ms, 0, MAX_NACK_DELAY_MS)
        self._check(group, topic)
        sources = self._sources(group, topic)
        applied, stale = [], []
        backs = []
        for receipt in receipts:
            found = self._find(sources, receipt)
            if found is None:
                stale.append(receipt)
                continue
            source, queue, offset, delivery = found
            delivery.move(State.HANDING_BACK)
            delivery.delay_ms = -1 if delay_ms is None else delay_ms
            backs.append(self._hand_back(group, source, queue, offset))
            applied.append(receipt)
        await asyncio.gather(*backs)
        return Settled(applied, stale)

    def extend(self, group: str, topic: str, receipts: Sequence[str], invisible_ms: int) -> Settled:
        """Keep the messages invisible for ``invisible_ms`` from now; their receipts stay."""
        _bounded("invisible_ms", invisible_ms, MIN_INVISIBLE_MS, MAX_INVISIBLE_MS)
        self._check(group, topic)
        sources = self._sources(group, topic)
        applied, stale = [], []
        deadline = time.monotonic() + invisible_ms / 1000
        extended: dict[str, tuple[_Source, list[_Flying]]] = {}
        for receipt in receipts:
            found = self._find(sources, receipt)
            if found is None:
                stale.append(receipt)
                continue
            source, queue, offset, delivery = found
            delivery.deadline = deadline
            extended.setdefault(source.kind, (source, []))[1].append((queue, offset, delivery))
            applied.append(receipt)
        for source, flying in extended.values():
            self._schedule(group, source, deadline, flying)
        return Settled(applied, stale)

    # --- joining and reading ---

    async def _lane(self, group: str, topic: str) -> _Lane:
        _check_names(group, topic)
        lane = self._lanes.get((group, topic))
        if lane is None:
            lane = _Lane(group, _Source("m", topic), time.monotonic())
            await self._join(group, lane.main)  # first: it makes the group's retry topic
            # A broker that may not commit the group's offsets (a slave) must not hand out
            # what it could never acknowledge: an empty commit asks it, and it refuses.
            await self._call(
                Opcode.ACK, AckRequest(group, topic, MEMBER_ID, lane.main.generation, [])
            )
            lane = self._lanes.setdefault((group, topic), lane)
        if group not in self._retries:
            retries = _Source("r", retry_topic(group))
            await self._join(group, retries)
            self._retries.setdefault(group, retries)
        lane.seen = time.monotonic()
        return lane

    def _check(self, group: str, topic: str) -> None:
        """The names an acknowledgement comes with, checked as a receive checks them."""
        _check_names(group, topic)
        self._topics.get(topic)

    async def _join(self, group: str, source: _Source) -> None:
        """Heartbeat as the broker's member; forget queues the group gave to others."""
        answer = await self._call(
            Opcode.HEARTBEAT, HeartbeatRequest(group, source.topic, MEMBER_ID)
        )
        assert isinstance(answer, HeartbeatResponse)
        kept = set(answer.queues)
        for queue in set(source.queues) | set(source.next) | set(source.flight):
            if queue not in kept:
                source.drop(queue)
        source.generation, source.queues = answer.generation, list(answer.queues)

    def _take_waiting(self, lane: _Lane, room: int, until: float) -> list[Received]:
        """Retry copies of the lane's topic read earlier for another topic's receivers."""
        retries = self._retries.get(lane.group)
        out: list[Received] = []
        if retries is None:
            return out
        taken: list[_Flying] = []
        for queue, flying in retries.flight.items():
            for offset, d in sorted(flying.items()):
                if len(out) >= room:
                    break
                if d.state is State.WAITING and d.message and d.message.topic == lane.topic:
                    out.append(self._hand_out(retries, queue, offset, d, until))
                    taken.append((queue, offset, d))
        self._schedule(lane.group, retries, until, taken)
        return out

    async def _read(
        self, lane: _Lane, max_messages: int, deadline: float, invisible_ms: int
    ) -> list[Received]:
        """What the topic and the group's retry topic hold now; if nothing, a PULL of each held
        at once until the first answers with messages or the wait ends. The others are
        cancelled, which loses nothing: a PULL keeps no state, and positions move only here."""
        async with lane.reading:
            out = await self._pulls(lane, max_messages, 0, invisible_ms, race=False)
        hold_ms = int((deadline - time.monotonic()) * 1000)
        if out or hold_ms <= 0:
            return out
        return await self._pulls(lane, max_messages, hold_ms, invisible_ms, race=True)

    async def _pulls(
        self, lane: _Lane, max_messages: int, hold_ms: int, invisible_ms: int, *, race: bool
    ) -> list[Received]:
        sources = [lane.main, self._retries[lane.group]]
        answers: list[PullResponse | Exception | None]
        if race:
            answers = await self._first_pull(lane.group, sources, max_messages, hold_ms)
        else:
            # Unheld, each PULL answers at once: one after the other takes no longer than
            # both at once, and needs no task each.
            answers = []
            for source in sources:
                try:
                    answers.append(await self._pull(lane.group, source, max_messages, hold_ms))
                except Exception as e:  # raised below, in the sources' order, as a held one's
                    answers.append(e)
        out: list[Received] = []
        until = time.monotonic() + invisible_ms / 1000
        for source, answer in zip(sources, answers, strict=True):
            if isinstance(answer, Exception):
                raise answer
            if answer is not None:
                out += self._deliver(lane, source, answer, max_messages - len(out), until)
        return out

    async def _first_pull(
        self, group: str, sources: list[_Source], max_messages: int, hold_ms: int
    ) -> list[PullResponse | Exception | None]:
        """Each source's PULL, held at once until the first answers (or the receiver stops):
        its answer, or failure; None for those cancelled."""
        pulls = [asyncio.create_task(self._pull(group, s, max_messages, hold_ms)) for s in sources]
        stop = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait([*pulls, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in [*pulls, stop]:
                t.cancel()
            await asyncio.gather(*pulls, stop, return_exceptions=True)
        answers: list[PullResponse | Exception | None] = []
        for pull in pulls:
            if pull.cancelled():
                answers.append(None)
                continue
            error = pull.exception()
            answers.append(error if isinstance(error, Exception) else pull.result())
        return answers

    async def _pull(
        self, group: str, source: _Source, max_messages: int, hold_ms: int
    ) -> PullResponse | None:
        generation = source.generation
        positions = [QueuePosition(q, o) for q, o in source.next.items() if q in source.queues]
        req = PullRequest(
            group, source.topic, MEMBER_ID, generation, max_messages, hold_ms, positions=positions
        )
        try:
            answer = await self._call(Opcode.PULL, req)
        except StaleGeneration:
            await self._join(group, source)
            return None
        assert isinstance(answer, PullResponse)
        return answer if generation == source.generation else None

    def _deliver(
        self, lane: _Lane, source: _Source, answer: PullResponse, room: int, until: float
    ) -> list[Received]:
        """Hand out what a PULL read, up to ``room``, and move the positions past it. Runs
        without a pause, so of two reads from the same positions (two receives at once, or two
        topics' receives of the group's retry topic) only the first takes a message: the other
        finds its offset behind the position. A message past ``room`` is not taken, nor any
        after it in its queue, whose position stays at it. A retry copy of another topic
        waits for a receiver of that topic."""
        nexts = {p.queue_id: p.offset for p in answer.next_offsets}
        full: set[int] = set()
        out: list[Received] = []
        taken: list[_Flying] = []
        kind, flight, nonces = source.kind, source.flight, self._nonces
        for m in answer.messages:
            q, offset = m.queue_id, m.queue_offset
            if q not in source.queues or q in full:
                continue
            flying = flight.get(q)
            if flying is None:
                flying = flight[q] = {}
            if offset < source.next.get(q, 0) or offset in flying:
                continue  # another read took it
            if kind == "r" and m.topic != lane.topic:
                flying[offset] = _Delivery(m, State.WAITING)
                continue
            if len(out) >= room:
                full.add(q)
                nexts[q] = offset
                continue
            # Handed out as it is read: invisible from the start (a retry copy read for
            # another topic's receivers is handed out later, by _hand_out).
            receipt = _receipt(kind, q, offset, nonces.next())
            delivery = flying[offset] = _Delivery(None, State.INVISIBLE, receipt, until)
            out.append(Received(m, receipt))
            taken.append((q, offset, delivery))
        for q, offset in nexts.items():
            if q in source.queues:
                source.next[q] = max(source.next.get(q, offset), offset)
        self._schedule(lane.group, source, until, taken)
        return out

    def _hand_out(
        self, source: _Source, queue: int, offset: int, d: _Delivery, until: float
    ) -> Received:
        """A waiting delivery, invisible until ``until`` (the caller schedules its deadline)."""
        message, d.message = d.message, None
        assert message is not None, "a delivery is handed out once"
        d.move(State.INVISIBLE)
        d.receipt = _receipt(source.kind, queue, offset, self._nonces.next())
        d.deadline = until
        return Received(message, d.receipt)

    def _source(self, group: str, kind: str, topic: str) -> _Source | None:
        if kind == "r":
            return self._retries.get(group)
        lane = self._lanes.get((group, topic))
        return lane.main if lane is not None else None

    def _sources(self, group: str, topic: str) -> dict[str, _Source | None]:
        """The sources a receipt of (group, topic) may name, by the kind it says."""
        return {"m": self._source(group, "m", topic), "r": self._retries.get(group)}

    def _find(
        self, sources: dict[str, _Source | None], receipt: str
    ) -> tuple[_Source, int, int, _Delivery] | None:
        """The delivery ``receipt`` names, if it is in flight and invisible."""
        if _RECEIPT.fullmatch(receipt) is None:
            raise InvalidArgument(f"{receipt!r} is not a receipt this broker gave")
        kind, queue_text, offset_text, _ = receipt.split(".")
        source = sources[kind]
        if source is None:
            return None
        queue, offset = int(queue_text), int(offset_text)
        flying = source.flight.get(queue)
        delivery = flying.get(offset) if flying is not None else None
        if delivery is None or delivery.receipt != receipt or delivery.state is not State.INVISIBLE:
            return None
        return source, queue, offset, delivery

    # --- committing and handing back ---

    async def _commit(self, group: str, source: _Source) -> None:
        """Commit each changed queue up to its lowest offset in flight (or its read position)."""
        positions = []
        for q in sorted(source.dirty):
            offset = source.commit_offset(q)
            if offset is not None and q in source.queues:
                positions.append(QueuePosition(q, offset))
        source.dirty.clear()
        if not positions:
            return
        req = AckRequest(group, source.topic, MEMBER_ID, source.generation, positions)
        try:
            await self._call(Opcode.ACK, req)
        except StaleGeneration:
            await self._join(group, source)  # the queues kept are committed by the next change
            source.dirty.update(p.queue_id for p in positions if p.queue_id in source.queues)

    async def _hand_back(self, group: str, source: _Source, queue: int, offset: int) -> None:
        """NACK a delivery being handed back; once its copy is written it is no longer in
        flight. A failure leaves it handing back, for the sweeper to try again."""
        delivery = source.flight.get(queue, {}).get(offset)
        if delivery is None or delivery.state is not State.HANDING_BACK or delivery.busy:
            return
        delay = None if delivery.delay_ms < 0 else delivery.delay_ms
        req = NackRequest(group, source.topic, MEMBER_ID, source.generation, queue, offset, delay)
        delivery.busy = True
        try:
            await self._call(Opcode.NACK, req)
        except StaleGeneration:
            await self._join(group, source)  # a queue taken away was dropped with its deliveries
            return
        except NotFound:
            pass  # the message is gone (its topic deleted, or retention): nothing to hand back
        except TxbError as e:
            log.warning(
                "cannot hand back %s/%d/%d for group %s: %s; retrying",
                source.topic,
                queue,
                offset,
                group,
                e,
            )
            return
        finally:
            delivery.busy = False
        flying = source.flight.get(queue, {})
        if flying.get(offset) is delivery:
            del flying[offset]
            source.dirty.add(queue)
            await self._commit(group, source)

    def _schedule(
        self, group: str, source: _Source, deadline: float, flying: list[_Flying]
    ) -> None:
        """Hand ``flying`` back at ``deadline`` unless acknowledged or extended before."""
        if not flying:
            return
        self._seq += 1
        entry = (deadline, self._seq, group, source.kind, source.topic, flying)
        heapq.heappush(self._deadlines, entry)
        self._scheduled += len(flying)

    # --- the sweeper ---

    async def _sweep(self) -> None:
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self._expire(time.monotonic())
                if time.monotonic() - renewed >= RENEW_S:
                    renewed = time.monotonic()
                    await self._renew()
            except Exception:  # the next round tries again; the log says why
                log.exception("receipts: sweeping failed")

    def _expire(self, now: float) -> None:
        """Hand back every delivery whose invisibility ended, at once (no retry delay)."""
        while self._deadlines and self._deadlines[0][0] <= now:
            entry = heapq.heappop(self._deadlines)
            self._scheduled -= len(entry[5])
            source, current = self._current(entry)
            for queue, offset, delivery in current:
                assert source is not None
                delivery.move(State.HANDING_BACK)
                delivery.delay_ms = 0
                self._spawn(self._hand_back(entry[2], source, queue, offset))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._handing_back.add(task)
        task.add_done_callback(self._handing_back.discard)

    async def _renew(self) -> None:
        """Renew the broker's memberships and retry hand-backs that failed. Leave a (group,
        topic) idle with nothing handed out, and a group's retry topic once none of its topics
        is received from, so their queues go back to the group's TCP consumers."""
        now = time.monotonic()
        for key, lane in list(self._lanes.items()):
            idle = now - lane.seen > IDLE_S and lane.receiving == 0
            if idle and lane.main.handed_out() == 0:
                del self._lanes[key]
                await self._leave(lane.group, lane.main)
            elif not await self._renew_source(lane.group, lane.main):
                self._lanes.pop(key, None)  # its topic was deleted, and its messages with it
        groups = {g for g, _ in self._lanes}
        for group, retries in list(self._retries.items()):
            if group not in groups and retries.handed_out() == 0:
                del self._retries[group]
                await self._leave(group, retries)
            elif not await self._renew_source(group, retries):
                del self._retries[group]
        self._compact()

    def _compact(self) -> None:
        """Drop the deadlines of deliveries acknowledged, extended or handed back since, once
        they outnumber the live ones: an acknowledged delivery's deadline stays in the heap
        until it comes up, which with long invisibilities would hold memory for hours."""
        if self._scheduled <= 2 * self._live_scheduled + COMPACT_MIN:
            return
        kept: list[_Deadline] = []
        for entry in self._deadlines:
            _, current = self._current(entry)
            if current:
                entry[5][:] = current
                kept.append(entry)
        heapq.heapify(kept)
        self._deadlines = kept
        self._scheduled = self._live_scheduled = sum(len(e[5]) for e in kept)

    def _current(self, entry: _Deadline) -> tuple[_Source | None, list[_Flying]]:
        """Of a deadline's deliveries, those it still is the deadline of: in flight, invisible,
        not extended since; and their source."""
        deadline, _, group, kind, topic, flying = entry
        source = self._source(group, kind, topic)
        if source is None:
            return None, []
        flight = source.flight
        return source, [
            (queue, offset, d)
            for queue, offset, d in flying
            if d.state is State.INVISIBLE  # first: most are acknowledged, which ends here
            and d.deadline == deadline
            and flight.get(queue, {}).get(offset) is d
        ]

    async def _renew_source(self, group: str, source: _Source) -> bool:
        """Heartbeat, and retry the hand-backs that failed; False if the topic is gone."""
        try:
            await self._join(group, source)
        except (NotFound, NotMaster):
            # The topic was deleted, or this broker is no longer the master (the new one
            # delivers again what was in flight here): nothing here is of use any more.
            return False
        except TxbError as e:
            log.warning("receipts: cannot renew %s of %s: %s", source.topic, group, e)
            return True
        for queue, flying in list(source.flight.items()):
            for offset, d in list(flying.items()):
                if d.state is State.HANDING_BACK and not d.busy:
                    self._spawn(self._hand_back(group, source, queue, offset))
        return True

    async def _leave(self, group: str, source: _Source) -> None:
        with contextlib.suppress(TxbError):
            await self._call(Opcode.LEAVE, LeaveRequest(group, source.topic, MEMBER_ID))


def _bounded(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be {low}..{high}, not {value}")


def _check_names(group: str, topic: str) -> None:
    """The group as HEARTBEAT checks it; the topic a user topic (a group's retries come with
    every topic it receives from, so its retry topic is not received from by name)."""
    validate_topic(group, allow_system=False)
    if len(group) > MAX_GROUP_NAME:
        raise InvalidArgument(
            f"group name is {len(group)} characters; the limit is {MAX_GROUP_NAME}"
        )
    if topic.startswith("%"):
        raise InvalidName(f"topic {topic!r} is internal to the broker")
