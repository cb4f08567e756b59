"""The slave's side of replication: follow the master's commit log.

One task, one connection to the master, one request at a time: REPL_FETCH from the end of the
local log (reporting the local flushed offset), write the answer verbatim at the same offsets
(``MessageStore.append_replicated``), fdatasync, wake long polls on the queues that grew. The
master's topics are copied (its deletions too, with its fences) before an answer's records
are written when the answer's topics version is not the one copied last (the next fetch
says which one this slave holds: a sync master's topic creation or deletion waits for that).
A lost connection is retried with a bounded backoff. A ``txbs://`` master is followed over TLS,
its certificate checked (``runtime/tls.py``'s client context, from the broker's ``tls_ca``,
``tls_cert`` and ``tls_key``), and the HELLO carries the broker's auth token. It speaks the wire
protocol through ``txbroker.protocol`` directly: the broker may not import the SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from txbroker.errors import (
    InvalidArgument,
    ProtocolError,
    ReplicationError,
    TopicExists,
    TxbError,
    error_class,
)
from txbroker.protocol.codec import FrameDecoder, encode_frame
from txbroker.protocol.frames import FrameKind, Opcode
from txbroker.protocol.messages import (
    DeletedTopic,
    Empty,
    Hello,
    ReplFetchRequest,
    ReplFetchResponse,
    TopicInfo,
    decode_error,
    decode_response,
    encode_body,
)
from txbroker.server.deletion import TopicDeletion
from txbroker.server.replication.epochs import EpochHistory
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore, TopicFence

__all__ = ["Replicator", "replica_name"]

log = logging.getLogger(__name__)

FETCH_BYTES: Final = 1 << 20  # per fetch: large enough to amortise a round trip and an fsync
FETCH_WAIT_MS: Final = 1_000  # the master holds an idle fetch this long (the report's age)
CONNECT_TIMEOUT_S: Final = 5.0
# A request's answer must come within its hold time plus this (a dead master, a black hole).
ANSWER_MARGIN_S: Final = 10.0
BACKOFF_S: Final = (0.1, 0.2, 0.5, 1.0, 2.0)  # reconnect pauses; the last one repeats
# A master older than the topics version in fetch answers: its topics are copied this often,
# and whenever a record names an unknown one.
TOPICS_REFRESH_S: Final = 2.0
# How often the master's consumer offsets are copied (in a fetch): a consumer group moving to
# this broker after a failover redelivers at most this much of its progress (RocketMQ's
# slaves copy them every 10 s).
OFFSETS_REFRESH_S: Final = 2.0


def replica_name(meta_dir: Path) -> str:
    """This slave's stable name, kept in ``<data>/meta/replica-id`` (made on first start): the
    master counts one slave per name, whatever its address."""
    path = meta_dir / "replica-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        name = uuid.uuid4().hex
        meta_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(name + "\n")
        return name


def _address(url: str) -> tuple[str, int, bool]:
    """``txb://host:port`` (or ``txbs://``) to the host, the port and whether it is TLS."""
    scheme, sep, rest = url.partition("://")
    host, colon, port = rest.rstrip("/").rpartition(":")
    if scheme not in ("txb", "txbs") or not sep or not colon or not port.isdigit():
        raise InvalidArgument(f"replica_of must be txb://host:port (txbs:// for TLS), got {url!r}")
    return host.strip("[]"), int(port), scheme == "txbs"


class _Link:
    """One connection to the master; requests strictly one after another."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder(known_opcodes=False)
        self._frames: list[Any] = []
        self._corr = 0

    async def call(self, opcode: int, body: object, timeout_s: float) -> Any:
        self._corr = (self._corr + 1) & 0xFFFFFFFF
        self._writer.write(encode_frame(FrameKind.REQUEST, opcode, self._corr, encode_body(body)))
        async with asyncio.timeout(timeout_s):
            await self._writer.drain()
            while True:
                while self._frames:
                    frame = self._frames.pop(0)
                    if frame.corr_id != self._corr:
                        continue  # an answer to a request given up on: not ours
                    if frame.kind == FrameKind.ERROR:
                        err = decode_error(frame.body)
                        raise error_class(err.code)(err.message)
                    return decode_response(opcode, frame.body)
                data = await self._reader.read(1 << 20)
                if not data:
                    raise ConnectionError("the master closed the connection")
                self._frames.extend(self._decoder.feed(data))

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


class _Diverged(Exception):
    def __init__(self, cut_at: int, epochs: list[tuple[int, int]]) -> None:
        super().__init__(f"the log diverges from the master's at offset {cut_at}")
        self.cut_at = cut_at
        self.epochs = epochs


class Replicator:
    """Follows ``master``'s log until stopped. With an epoch history (``--role auto``), each
    fetch names this log's last epoch; a master answering that the log runs past that epoch's
    end there stops it, and ``on_diverged(offset, master's history)`` decides (failover.py).
    ``tls`` gives the client context for a ``txbs://`` master (made on first use: a broker that
    follows only plain masters needs none)."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        deletion: TopicDeletion,
        master: str,
        name: str,
        notify: Callable[[str, int], None],
        auth_token: str | None = None,
        *,
        epochs: EpochHistory | None = None,
        on_diverged: Callable[[int, list[tuple[int, int]]], None] | None = None,
        on_offsets: Callable[[dict[str, dict[str, dict[int, int]]]], None] | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
    ) -> None:
        self._store = store
        self._topics = topics
        self._deletion = deletion
        self.master = master
        host, port, self._tls = _address(master)
        self._addr = (host, port)
        self._tls_context = tls
        self.name = name
        self._notify = notify
        self._token = auth_token
        self._epochs = epochs
        self._on_diverged = on_diverged
        self._on_offsets = on_offsets
        self._task: asyncio.Task[None] | None = None
        self.master_flushed = 0  # as of the last answer (lag = this - the local flushed offset)
        self.master_covered = 0  # as of the last answer: on enough slaves below this
        self.connected = False
        self.fetches = 0
        self.last_error: str | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="txb-replicator")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except _Diverged as e:
                self.last_error = str(e)
                log.warning("replication from %s stops: %s", self.master, e)
                if self._on_diverged is not None:
                    self._on_diverged(e.cut_at, e.epochs)
                return
            except (OSError, ConnectionError, TimeoutError, TxbError) as e:
                self.connected = False
                self.last_error = f"{type(e).__name__}: {e}"
                pause = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                log.warning(
                    "replication from %s: %s; again in %.1f s", self.master, self.last_error, pause
                )
                if self._store.committer.failure is not None:
                    log.error("replication stops: the store failed")
                    return
                await asyncio.sleep(pause)
            else:  # pragma: no cover - _follow only returns by raising
                failures = 0

    async def _follow(self) -> None:
        host, port = self._addr
        ctx = None
        if self._tls:
            if self._tls_context is None:
                raise ReplicationError("the master serves TLS and this follower has no context")
            ctx = self._tls_context()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(
                    host, port, ssl=ctx, server_hostname=host if ctx is not None else None
                )
        except ssl.SSLCertVerificationError as e:
            raise ReplicationError(
                f"TLS: the master did not prove who it is ({e.verify_message}): give this "
                "broker --tls-ca, the CA that signed the master's certificate, and let the "
                "certificate name the host the master advertises"
            ) from e
        except ssl.SSLError as e:
            raise ReplicationError(
                f"TLS handshake with the master failed ({e.reason or e}); does it serve TLS "
                "on this port, and (mutual TLS) does it accept this broker's --tls-cert?"
            ) from e
        link = _Link(reader, writer)
        try:
            await link.call(
                Opcode.HELLO, Hello(f"replica:{self.name}", self._token), CONNECT_TIMEOUT_S
            )
            self.connected = True
            self.last_error = None
            log.info("replicating %s from offset %d", self.master, self._store.write_offset)
            copied: int | None = None  # the master's topics version copied on this connection
            topics_at = 0.0  # when they were copied last (for an older master)
            offsets_at = 0.0
            store = self._store
            while True:
                with_offsets = (
                    self._on_offsets is not None
                    and time.monotonic() - offsets_at > OFFSETS_REFRESH_S
                )
                req = ReplFetchRequest(
                    self.name,
                    store.write_offset,
                    store.flushed_offset,
                    FETCH_BYTES,
                    FETCH_WAIT_MS,
                    self._epochs.last_epoch if self._epochs is not None else 0,
                    with_offsets,
                    copied if copied is not None else 0,
                )
                resp: ReplFetchResponse = await link.call(
                    Opcode.REPL_FETCH, req, FETCH_WAIT_MS / 1000 + ANSWER_MARGIN_S
                )
                self.fetches += 1
                self.master_flushed = resp.master_flushed
                self.master_covered = resp.master_covered
                if resp.truncate_to >= 0:
                    raise _Diverged(resp.truncate_to, resp.epochs)
                if self._epochs is not None and resp.epochs:
                    # Kept before the bytes it covers are written: a log is never longer
                    # than what its history accounts for.
                    self._epochs.adopt(resp.epochs)
                # Before the records (and the offsets, kept for known topics only): every record
                # here was written on the master after its topic was created, so this version
                # counts that creation. No record names a topic this slave lacks, and a slave
                # holding a record holds every topic created before it.
                version, older = resp.topics_version, resp.topics_version < 0
                if (version != copied and not older) or (
                    older and time.monotonic() - topics_at > TOPICS_REFRESH_S
                ):
                    await self._copy_topics(link, resp.deleted)
                    copied, topics_at = version, time.monotonic()
                if with_offsets:
                    offsets_at = time.monotonic()
                    if resp.offsets is not None and self._on_offsets is not None:
                        self._on_offsets(resp.offsets)
                if resp.data or resp.next_offset != resp.offset:
                    grew = store.append_replicated(resp.offset, resp.data, resp.next_offset)
                    await store.committer.wait_durable()
                    if older and any(not self._topics.exists(t) for t, _ in grew):
                        await self._copy_topics(link)
                        topics_at = time.monotonic()
                    for topic, qid in grew:
                        self._notify(topic, qid)
        finally:
            self.connected = False
            await link.close()

    async def _copy_topics(
        self, link: _Link, deleted: dict[str, DeletedTopic] | None = None
    ) -> None:
        """Delete here what the master deleted (``deleted``: its fences) and create the
        master's topics this slave lacks (consumers pull them by name)."""
        held = self._topics.fences
        for name, d in sorted((deleted or {}).items()):
            mine = held.get(name)
            # A fence this slave holds as far is that deletion, taken before (or one of its
            # own, at the same point of the same log); a later one is a deletion since.
            if mine is None or d.phys > mine.phys:
                await self._deletion.follow(name, TopicFence(d.phys, d.ends))
        listed: list[TopicInfo] = await link.call(Opcode.TOPIC_LIST, Empty(), ANSWER_MARGIN_S)
        for t in listed:
            if self._topics.exists(t.topic):
                continue
            try:
                self._topics.create(t.topic, t.queues)
            except (TopicExists, InvalidArgument, ProtocolError) as e:
                log.warning("replication: cannot copy topic %r: %s", t.topic, e)
