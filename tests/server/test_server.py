"""A real `txbroker serve` process over TCP: round trips, bad input, auth, clean shutdown."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, free_port
from txbroker.errors import (
    BadRequest,
    FrameTooLarge,
    InvalidArgument,
    InvalidName,
    NotFound,
    TopicExists,
    Unauthenticated,
)
from txbroker.protocol.codec import encode_frame
from txbroker.protocol.frames import HEADER, FrameKind, Opcode
from txbroker.protocol.messages import AckRequest, QueuePosition, SendRequest
from txbroker_sdk import Client
from txbroker_sdk.errors import ConnectionClosed


async def test_topics_and_sends_round_trip(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        info = await c.create_topic("orders", queues=3)
        assert (info.topic, info.queues) == ("orders", 3)
        with pytest.raises(TopicExists):
            await c.create_topic("orders", queues=5)
        r1 = await c.send("orders", b"one", key="k")
        r2 = await c.send("orders", b"two", key="k")
        assert r1.queue_id == r2.queue_id and r2.queue_offset == r1.queue_offset + 1
        batch = await c.send_batch([SendRequest("orders", bytes([i])) for i in range(10)])
        assert len(batch) == 10
        assert (await c.describe_topic("orders")).messages == 12
        assert [t.topic for t in await c.list_topics()] == ["orders"]
        with pytest.raises(NotFound):
            await c.send("missing", b"x")
        with pytest.raises(InvalidName):
            await c.create_topic("bad/name")


async def test_pipelined_sends_on_one_connection(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("p", queues=1)
        receipts = await asyncio.gather(*(c.send("p", str(i).encode()) for i in range(200)))
        assert sorted(r.queue_offset for r in receipts) == list(range(200))


async def _raw(url: str, payload: bytes) -> bytes:
    host, port = url.removeprefix("txb://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(payload)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)  # until the server closes
    writer.close()
    return data


@pytest.mark.parametrize(
    "payload",
    [
        # Random bytes from a fixed seed: each xdist worker collects the same test, and a
        # failure comes again with the same bytes.
        random.Random(4096).randbytes(4096),
        (1 << 30).to_bytes(4, "big") + b"\x01\x00\x00\x14",  # 1 GiB length prefix
        encode_frame(FrameKind.REQUEST, Opcode.PING, 1, b"")[:7],  # truncated, then EOF
        encode_frame(FrameKind.RESPONSE, Opcode.PING, 1, b""),  # wrong direction
        HEADER.pack(8, 1, 0, 999, 1),  # an opcode no version of the protocol defines
    ],
)
async def test_bad_streams_are_closed_and_others_unaffected(
    broker: BrokerProcess, payload: bytes
) -> None:
    async with await Client.connect(broker.url) as good:
        await good.create_topic("t", queues=1)
        host, port = broker.url.removeprefix("txb://").split(":")
        if (
            payload.startswith(encode_frame(FrameKind.REQUEST, Opcode.PING, 1, b"")[:7])
            and len(payload) == 7
        ):
            with socket.create_connection((host, int(port))) as s:
                s.sendall(payload)
                s.shutdown(socket.SHUT_WR)
        else:
            answer = await _raw(broker.url, payload)
            assert b"PROTOCOL_ERROR" in answer or b"FRAME_TOO_LARGE" in answer
        # The broker still serves the well-behaved client.
        assert (await good.send("t", b"still here")).queue_offset == 0


async def test_unknown_opcode_and_malformed_body_keep_the_connection(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        with pytest.raises(BadRequest, match="not served"):
            await c.request(Opcode.LOOKUP, {})  # defined, not served
        with pytest.raises(BadRequest):
            await c.request(Opcode.SEND, {"topic": 5})
        await c.ping()


async def test_auth_token_required(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "auth", "--auth-token", "s3cret").start()
    try:
        with pytest.raises(Unauthenticated):
            await Client.connect(b.url, auth_token="wrong")
        async with await Client.connect(b.url, auth_token="s3cret") as c:
            await c.ping()
        # Skipping HELLO is refused too.
        answer = await _raw(b.url, encode_frame(FrameKind.REQUEST, Opcode.PING, 1, b"\x80"))
        assert b"UNAUTHENTICATED" in answer
    finally:
        assert b.stop() == 0


async def test_sigterm_stops_cleanly_and_data_survives(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "b").start()
    async with await Client.connect(b.url) as c:
        await c.create_topic("keep", queues=1)
        await c.send("keep", b"durable")
    assert b.stop() == 0
    assert not (tmp_path / "b" / "store" / "abort").exists()  # a clean shutdown
    b2 = BrokerProcess(tmp_path / "b").start()
    try:
        async with await Client.connect(b2.url) as c:
            assert (await c.describe_topic("keep")).messages == 1
    finally:
        b2.stop()


async def test_oversized_frame_from_the_client_is_refused_locally(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("big", queues=1)
        with pytest.raises(FrameTooLarge):
            await c.send("big", bytes(17 * 1024 * 1024))
        await c.ping()


async def test_connecting_to_nothing_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        await Client.connect(f"txb://127.0.0.1:{port}", timeout_s=2, connect_deadline_s=0)


async def test_client_reconnects_after_a_broker_restart(tmp_path: Path) -> None:
    port = free_port()  # the restarted broker binds it again
    b = BrokerProcess(tmp_path / "rc", "--port", str(port)).start()
    c = await Client.connect(b.url, reconnect_s=20)
    try:
        await c.create_topic("t", queues=1)
        await c.send("t", b"before")
        hb = await c.request(Opcode.HEARTBEAT, {"group": "g", "topic": "t", "member_id": "m"})
        await c.request(Opcode.ACK, AckRequest("g", "t", "m", hb.generation, [QueuePosition(0, 1)]))
        long_poll = {"group": "g", "topic": "t", "member_id": "m", "generation": hb.generation}
        pending = asyncio.create_task(c.request(Opcode.PULL, long_poll))
        await c.ping()  # answered after the PULL was read: the PULL is parked at the broker now
        assert not pending.done()
        b.kill()
        with pytest.raises(ConnectionClosed):
            await pending  # in flight when the broker died: fails, its outcome unknown
        assert not c.connected
        b = BrokerProcess(tmp_path / "rc", "--port", str(port)).start()
        r = await c.send("t", b"after", idempotency_key="after-1")  # reconnects on its own
        assert r.queue_offset >= 1 and c.reconnects == 1
    finally:
        await c.close()
        b.stop()
    with pytest.raises(ConnectionClosed, match="client closed"):
        await c.ping()  # closed by us: no reconnect


async def test_idempotency_key_dedup_across_a_broker_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "ik").start()
    async with await Client.connect(b.url) as c:
        await c.create_topic("pay", queues=2)
        first = await c.send("pay", b"charge 10", idempotency_key="charge-42")
    assert b.stop() == 0
    b = BrokerProcess(tmp_path / "ik").start()
    try:
        async with await Client.connect(b.url) as c:
            again = await c.send("pay", b"charge 10", idempotency_key="charge-42")
            assert again.duplicate and again.message_id == first.message_id
            assert (again.queue_id, again.queue_offset) == (first.queue_id, first.queue_offset)
            assert (await c.describe_topic("pay")).messages == 1
    finally:
        b.stop()


async def test_clients_cannot_write_internal_topics(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("t", queues=1)
        for topic in ("%SCHEDULE", "%RETRY%g", "%DLQ%g"):
            with pytest.raises(InvalidName, match="reserved"):
                await c.send(topic, b"x")
        # Delayed delivery still works (its level was not jammed by a stray record).
        at = int(time.time() * 1000) + 300
        r = await c.send("t", b"later", deliver_at_ms=at)
        assert r.queue_offset == -1


async def test_group_names_leave_room_for_their_retry_topics(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("t", queues=1)
        with pytest.raises(InvalidArgument, match="limit is 120"):
            await c.request(Opcode.HEARTBEAT, {"group": "g" * 121, "topic": "t", "member_id": "m"})


async def test_stop_is_prompt_with_long_polls_held(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "stop").start()
    c = await Client.connect(b.url, reconnect_s=0)
    try:
        await c.create_topic("idle", queues=1)
        hb = await c.request(Opcode.HEARTBEAT, {"group": "g", "topic": "idle", "member_id": "m"})
        held = {"group": "g", "topic": "idle", "member_id": "m", "generation": hb.generation}
        pull = asyncio.create_task(c.request(Opcode.PULL, held))  # held for up to 30 s
        await c.ping()
        t0 = time.monotonic()
        assert await asyncio.to_thread(b.stop) == 0
        assert time.monotonic() - t0 < 5  # not the 10 s grace, nor the 30 s hold
        res = await pull
        assert res.messages == []  # answered, empty, before the connection closed
    finally:
        await c.close()


async def test_a_silent_server_times_requests_out() -> None:
    from txbroker_sdk.errors import RequestTimeout

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept bytes, never answer
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t0 = time.monotonic()
        with pytest.raises(RequestTimeout, match=r"HELLO got no answer within 0\.3 s"):
            await Client.connect(f"txb://127.0.0.1:{port}", timeout_s=0.3)
        assert 0.3 <= time.monotonic() - t0 < 2
    finally:
        server.close()
        await server.wait_closed()
