"""The client's connection handling: answers decoded as they arrive, requests posted without a
future (END_TX's way), and what a broker that goes silent, drops the connection or sends
garbage does to requests in flight. A scripted server plays the broker where the real one
cannot misbehave on demand."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from tests.conftest import BrokerProcess
from txbroker.errors import FrameTooLarge, ProtocolError
from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameKind, Opcode
from txbroker.protocol.messages import (
    Empty,
    HelloOk,
    SendReceipt,
    SendRequest,
    TxEndRequest,
    encode_body,
)
from txbroker_sdk import Client
from txbroker_sdk.connection import PROBE_S
from txbroker_sdk.errors import ConnectionClosed, RequestTimeout

# What the scripted server does with each request after HELLO: (request, writer) -> None.
Script = Callable[[Frame, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def scripted_broker(script: Script) -> AsyncIterator[str]:
    """A server that answers HELLO like the broker and hands every other request to ``script``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for frame in decoder.feed(data):
                    if frame.opcode == Opcode.HELLO:
                        hello = encode_body(HelloOk("scripted", PROTOCOL_VERSION))
                        writer.write(
                            encode_frame(FrameKind.RESPONSE, Opcode.HELLO, frame.corr_id, hello)
                        )
                    else:
                        await script(frame, writer)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"txb://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _never_answer(frame: Frame, writer: asyncio.StreamWriter) -> None:
    return None


async def _hang_up(frame: Frame, writer: asyncio.StreamWriter) -> None:
    writer.close()


async def _garbage(frame: Frame, writer: asyncio.StreamWriter) -> None:
    writer.write(b"\xff" * 64)  # a length no frame can have


async def test_a_posted_request_the_broker_refuses_is_logged_and_drained(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async with await Client.connect(broker.url) as c:
        c.post(Opcode.TX_END, TxEndRequest("no-such-tx", "commit"), note="the test expects it")
        assert c.unanswered == 1
        await c.drain(timeout_s=10)
        assert c.unanswered == 0
        await c.ping()  # the connection is fine
    [record] = [r for r in caplog.records if r.name == "txbroker_sdk.connection"]
    assert record.levelno == logging.WARNING
    assert "TX_END" in record.message and "no-such-tx" in record.message
    assert "not confirmed" in record.message and record.message.endswith("the test expects it")


async def test_a_posted_request_that_succeeds_logs_nothing(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    async with await Client.connect(broker.url) as c:
        for _ in range(50):
            c.post(Opcode.PING, Empty(), note="unexpected")
        await c.drain(timeout_s=10)
        assert c.unanswered == 0
    assert not [r for r in caplog.records if r.name == "txbroker_sdk.connection"]


async def test_a_posted_request_with_no_answer_times_out_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with scripted_broker(_never_answer) as url, await Client.connect(url) as c:
        t0 = time.monotonic()  # before the deadline is set: a preemption between can't count
        c.post(Opcode.TX_END, TxEndRequest("t1", "commit"), note="settled later", timeout_s=0.2)
        await c.drain(timeout_s=10)
        assert 0.2 <= time.monotonic() - t0 < 2  # the deadline ended it, not drain's bound
        assert c.unanswered == 0
    assert any(
        "TX_END got no answer within 0.2 s" in r.message and "settled later" in r.message
        for r in caplog.records
    )


async def test_a_dropped_connection_fails_what_is_in_flight_and_the_next_request_reconnects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with scripted_broker(_hang_up) as url:
        c = await Client.connect(url, reconnect_s=5)
        try:
            c.post(Opcode.TX_END, TxEndRequest("t1", "commit"), note="back-check")
            waiting = c.submit(Opcode.PING, Empty())
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(waiting, 10)
            await c.drain(timeout_s=10)
            assert c.unanswered == 0 and not c.connected
            assert any("TX_END" in r.message and "back-check" in r.message for r in caplog.records)
            # The scripted server hangs up again, but only after the reconnect's HELLO.
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(c.ping(), 10)
            assert c.reconnects == 1
        finally:
            await c.close()


async def test_garbage_from_the_broker_fails_the_connection_for_good() -> None:
    async with scripted_broker(_garbage) as url:
        c = await Client.connect(url)
        try:
            with pytest.raises(ProtocolError):
                await asyncio.wait_for(c.ping(), 10)
            assert not c.connected
            with pytest.raises(ProtocolError):  # not retried: the broker is not one we speak to
                await c.ping()
        finally:
            await c.close()


async def test_an_answer_nobody_waits_for_any_more_is_dropped(broker: BrokerProcess) -> None:
    """Answers are matched by correlation id as they arrive; the answer to a request its caller
    gave up on is dropped, and every other answer still reaches its own request."""
    async with await Client.connect(broker.url) as c:
        await c.create_topic("t", queues=1)
        gave_up = c.submit(Opcode.SEND, SendRequest("t", b"first", None, None, {}, None))
        gave_up.cancel()
        receipts = await asyncio.gather(*(c.send("t", b"%d" % i) for i in range(20)))
        offsets = {r.queue_offset for r in receipts}
        assert len(offsets) == 20 and offsets <= set(range(21))  # "first" took one offset too
        await c.drain(timeout_s=10)
        assert c.unanswered == 0


async def test_a_request_too_large_to_send_leaves_nothing_in_flight(broker: BrokerProcess) -> None:
    huge = SendRequest("t", b"x" * (MAX_FRAME_BYTES + 1), None, None, {}, None)
    async with await Client.connect(broker.url) as c:
        with pytest.raises(FrameTooLarge):
            c.post(Opcode.SEND, huge, note="never sent")
        with pytest.raises(FrameTooLarge):
            c.submit(Opcode.SEND, huge)
        assert c.unanswered == 0
        t0 = time.monotonic()
        await c.drain(timeout_s=10)
        assert time.monotonic() - t0 < 5  # nothing to wait for: not drain's 10 s
        await c.ping()


SLOW_S = 0.3  # how late the slow broker below answers a SEND: past the short timeout only
SHORT_TIMEOUT_S = 0.1


def _slow_broker(answers_ping: bool) -> tuple[Script, list[int]]:
    """A broker that answers each SEND ``SLOW_S`` late (a sync write waiting for a slave), and
    PING at once unless not ``answers_ping`` (a broker that stopped reading behind requests in
    flight), its connection alive all along; records the opcodes it was sent."""
    seen: list[int] = []

    async def answer(frame: Frame, writer: asyncio.StreamWriter) -> None:
        seen.append(frame.opcode)
        if frame.opcode == Opcode.PING and answers_ping:
            body = encode_body(Empty())
        elif frame.opcode == Opcode.SEND:
            await asyncio.sleep(SLOW_S)  # the broker's slowness, played
            body = encode_body(SendReceipt("m", "t", 0, 0))
        else:
            return
        writer.write(encode_frame(FrameKind.RESPONSE, frame.opcode, frame.corr_id, body))

    async def script(frame: Frame, writer: asyncio.StreamWriter) -> None:
        tasks.add(task := asyncio.create_task(answer(frame, writer)))  # answered out of order
        task.add_done_callback(tasks.discard)

    tasks: set[asyncio.Task[None]] = set()
    return script, seen


def _send(c: Client, timeout_s: float | None = None) -> Awaitable[SendReceipt]:
    req = SendRequest("t", b"x", None, None, {}, "k")
    return c.request(Opcode.SEND, req, timeout_s=timeout_s)


@pytest.mark.parametrize("answers_ping", [True, False], ids=["answers-ping", "busy"])
async def test_a_request_timing_out_on_a_live_connection_leaves_it_and_its_requests_alone(
    caplog: pytest.LogCaptureFixture, answers_ping: bool
) -> None:
    """A timeout makes the connection suspect and sends a probe; a broker heard from in time
    (the probe answered, or other answers coming) keeps it, with every request in flight."""
    script, seen = _slow_broker(answers_ping)
    async with scripted_broker(script) as url, await Client.connect(url) as c:
        other = asyncio.create_task(_send(c))  # another caller's, with the default timeout
        with pytest.raises(RequestTimeout):
            await asyncio.wait_for(_send(c, SHORT_TIMEOUT_S), 10)
        timed_out_at = time.monotonic()
        assert await asyncio.wait_for(other, 10) == SendReceipt("m", "t", 0, 0)
        # Past the probe's deadline, the connection still carries requests.
        while time.monotonic() - timed_out_at < PROBE_S + 0.5:
            await asyncio.wait_for(_send(c), 10)
        assert c.connected and c.reconnects == 0
    assert Opcode.PING in seen
    assert not [r for r in caplog.records if "presumed dead" in r.message]


async def test_a_request_timing_out_on_a_silent_connection_closes_it_as_dead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing comes back to the probe either: the connection is closed as dead within
    ``PROBE_S`` of the timeout, the other caller's request in flight fails then with
    ``ConnectionClosed`` rather than at its own timeout, and the next request connects again."""
    async with scripted_broker(_never_answer) as url, await Client.connect(url) as c:
        other = asyncio.create_task(_send(c, 30))
        with pytest.raises(RequestTimeout):
            await asyncio.wait_for(_send(c, SHORT_TIMEOUT_S), 10)
        timed_out_at = time.monotonic()
        with pytest.raises(ConnectionClosed, match="presumed dead"):
            await asyncio.wait_for(other, 10)
        assert time.monotonic() - timed_out_at < PROBE_S + 0.5
        assert not c.connected
        with pytest.raises(RequestTimeout):  # connected again, and silent again
            await asyncio.wait_for(_send(c, SHORT_TIMEOUT_S), 10)
        assert c.reconnects == 1
    [record] = [r for r in caplog.records if "presumed dead" in r.message]
    assert record.levelno == logging.WARNING and record.name == "txbroker_sdk.connection"
