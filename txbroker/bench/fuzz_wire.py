"""The socket-level fuzz: connections sending what no client should, beside a healthy one.

Each case is one connection of one kind (:data:`CASES`), then a PING that must be answered;
what the broker answered is counted by kind. Meanwhile a healthy SDK client sends and consumes
on a topic of its own; at the end every message it was acknowledged must have been consumed. A
case's random choices come from ``Random(f"{seed}:{case}")``: a crash example names both.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from txbroker.bench.fuzz_report import FuzzReport, LogWatch, alive, rss_kib
from txbroker.bench.fuzz_values import TOPICS, member_requests, random_body, session_start
from txbroker.errors import ProtocolError
from txbroker.protocol.codec import Frame, FrameDecoder, encode_frame
from txbroker.protocol.frames import HEADER, MAX_FRAME_BYTES, FrameKind, Opcode
from txbroker.protocol.messages import (
    REQUEST_TYPES,
    Empty,
    HeartbeatResponse,
    Hello,
    decode_error,
    decode_response,
    encode_body,
)

__all__ = ["HEALTHY_TOPIC", "fuzz_wire"]

HEALTHY_TOPIC: Final = "fuzz-healthy"
HEALTHY_GROUP: Final = "fuzz-healthy-group"
# The healthy producer's pace: steady traffic through the whole run without taking the CPU
# the fuzz connections and the broker share on a small machine.
HEALTHY_RATE_PER_S: Final = 200
# A case is a few round trips on loopback; the broker answers a PING within milliseconds, so
# 10 s without an answer or a close is a hang, not load.
CASE_TIMEOUT_S: Final = 10.0
# After the run, the healthy consumer has this long to catch up with what was acknowledged.
DRAIN_TIMEOUT_S: Final = 30.0
REQUESTS_MAX: Final = 8  # requests per body case
GARBAGE_MAX: Final = 64 * 1024  # bytes per random-bytes case
_OPCODES: Final = tuple(sorted(REQUEST_TYPES))
_PING: Final = encode_body(Empty())
_UTF8_LEADS: Final = (0xC3, 0xE2, 0xF0)  # first bytes of 2-, 3- and 4-byte UTF-8 characters


class _Crash(Exception):
    """What must not happen in a case: the reason, for the report."""


class _Conn:
    """One raw connection: write bytes, read the broker's frames until it closes or answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []
        self.closed = False
        self.reset = False  # closed by a reset rather than an orderly close
        self.corr = 0

    @classmethod
    async def open(cls, host: str, port: int) -> _Conn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def request(self, opcode: int, body: bytes) -> int:
        self.corr += 1
        self.writer.write(encode_frame(FrameKind.REQUEST, opcode, self.corr, body))
        return self.corr

    async def _read(self) -> None:
        try:
            data = await self.reader.read(65536)
        except OSError:
            data, self.reset = b"", True
        if not data:
            self.closed = True
            return
        try:
            self.frames += self.decoder.feed(data)
        except ProtocolError as e:
            raise _Crash(f"the broker sent a malformed stream: {e}") from e

    async def until_closed(self) -> None:
        while not self.closed:
            await self._read()

    async def until_answered(self, corr: int) -> bool:
        """True once ``corr`` is answered; False if the broker closed the connection first."""
        while not any(f.corr_id == corr for f in self.frames):
            if self.closed:
                return False
            await self._read()
        return True

    def stream_error(self) -> str | None:
        errors = [f for f in self.frames if f.opcode == Opcode.STREAM]
        return decode_error(errors[-1].body).code if errors else None

    def close(self) -> None:
        self.writer.close()


def _outcomes(conn: _Conn) -> list[str]:
    """Each answer by kind (``ok``, an error code), then how the connection ended."""
    out = []
    for f in conn.frames:
        if f.opcode == Opcode.STREAM:
            continue
        if f.kind == FrameKind.ERROR:
            err = decode_error(f.body)
            if err.code == "INTERNAL":
                raise _Crash(f"{Opcode(f.opcode).name} answered INTERNAL: {err.message}")
            out.append(f"answer {err.code}")
        else:
            out.append("answer ok")
    code = conn.stream_error()
    if code is not None:
        out.append(f"refused {code}")
    elif conn.closed:
        out.append("reset" if conn.reset else "closed")
    return out


def _hello(token: str | None) -> bytes:
    return encode_body(Hello("fuzz", token))


def _request_body(rng: random.Random) -> tuple[int, bytes]:
    op = rng.choice(_OPCODES)
    return op, encode_body(random_body(rng, REQUEST_TYPES[op]))


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    out = bytearray(raw)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(out) + 1)
        how = rng.randrange(5)
        if how == 0 and i < len(out):
            out[i] ^= rng.randrange(1, 256)
        elif how == 4 and i < len(out):
            out[i] = rng.choice(_UTF8_LEADS)  # at a string's end: a character cut short
        elif how == 1:
            out[i:i] = rng.randbytes(rng.randrange(1, 9))
        elif how == 2:
            del out[i : i + rng.randrange(1, 9)]
        else:
            del out[i:]
    return bytes(out)


Case = Callable[[_Conn, random.Random, str], Awaitable[None]]


async def _after_eof(conn: _Conn, data: bytes) -> None:
    """Send ``data``, half-close, and read until the broker closes."""
    conn.writer.write(data)
    conn.writer.write_eof()
    await conn.until_closed()


async def _random_bytes(conn: _Conn, rng: random.Random, token: str) -> None:
    await _after_eof(conn, rng.randbytes(rng.randrange(1, GARBAGE_MAX)))


async def _truncated(conn: _Conn, rng: random.Random, token: str) -> None:
    op, body = _request_body(rng)
    frame = encode_frame(FrameKind.REQUEST, op, 2, body)
    hello = encode_frame(FrameKind.REQUEST, Opcode.HELLO, 1, _hello(token))
    await _after_eof(conn, hello + frame[: rng.randrange(1, len(frame))])


async def _oversized(conn: _Conn, rng: random.Random, token: str) -> None:
    if rng.random() < 0.5:
        prefix = rng.randrange(MAX_FRAME_BYTES + 1, 2**32).to_bytes(4, "big")
    else:  # a 64-bit length, as another protocol (or a probe) would write it
        prefix = rng.randrange(2**32 * (MAX_FRAME_BYTES + 1), 2**63 + 1).to_bytes(8, "big")
    hello = encode_frame(FrameKind.REQUEST, Opcode.HELLO, 1, _hello(token))
    await _after_eof(conn, (hello if rng.random() < 0.5 else b"") + prefix + rng.randbytes(16))


async def _bad_header(conn: _Conn, rng: random.Random, token: str) -> None:
    version, kind, opcode = 1, 0, int(Opcode.PING)
    which = rng.randrange(4)
    if which == 0:
        version = rng.choice([0, 2, 255])
    elif which == 1:
        kind = rng.choice([1, 2, 3, 255])
    elif which == 2:
        opcode = rng.choice([3, 9, 99, 65535])
    length = rng.choice([0, 7]) if which == 3 else 8
    await _after_eof(conn, HEADER.pack(length, version, kind, opcode, 1))


async def _bad_hello(conn: _Conn, rng: random.Random, token: str) -> None:
    which = rng.randrange(4)
    if which == 0:
        conn.request(Opcode.HELLO, _hello(rng.choice([None, "", "wrong", token + "x"])))
    elif which == 1:
        conn.request(Opcode.HELLO, _mutate(rng, _hello(token)))
    elif which == 2:
        conn.request(*_request_body(rng))  # a request before HELLO
    else:
        conn.request(Opcode.HELLO, rng.randbytes(rng.randrange(64)))
    conn.writer.write_eof()
    await conn.until_closed()


async def _bodies(conn: _Conn, rng: random.Random, token: str, *, mutate: bool) -> None:
    if not await conn.until_answered(conn.request(Opcode.HELLO, _hello(token))):
        raise _Crash("the broker closed the connection after a valid HELLO")
    for _ in range(rng.randrange(1, REQUESTS_MAX + 1)):
        op, body = _request_body(rng)
        conn.request(op, _mutate(rng, body) if mutate else body)
    answered = await conn.until_answered(conn.request(Opcode.PING, _PING))
    if not answered and conn.stream_error() is None:
        raise _Crash("the broker closed the connection without an error")


async def _mutated_body(conn: _Conn, rng: random.Random, token: str) -> None:
    await _bodies(conn, rng, token, mutate=True)


async def _random_body(conn: _Conn, rng: random.Random, token: str) -> None:
    await _bodies(conn, rng, token, mutate=False)


async def _member(conn: _Conn, rng: random.Random, token: str) -> None:
    """Join a fuzz group, then act as its member with odd offsets, queues and generations."""
    if not await conn.until_answered(conn.request(Opcode.HELLO, _hello(token))):
        raise _Crash("the broker closed the connection after a valid HELLO")
    hb = session_start(rng)
    corr = conn.request(Opcode.HEARTBEAT, encode_body(hb))
    if not await conn.until_answered(corr):
        raise _Crash("the broker closed the connection after a HEARTBEAT")
    answer = next(f for f in conn.frames if f.corr_id == corr)
    if answer.kind != FrameKind.RESPONSE:
        return  # refused (a group of the other mode, say): counted with the answers
    joined: HeartbeatResponse = decode_response(Opcode.HEARTBEAT, answer.body)
    for op, body in member_requests(rng, hb, joined.generation, joined.queues, REQUESTS_MAX):
        conn.request(op, encode_body(body))
    answered = await conn.until_answered(conn.request(Opcode.PING, _PING))
    if not answered and conn.stream_error() is None:
        raise _Crash("the broker closed the connection without an error")


# Random bytes, a valid stream cut short, oversized length prefixes (4-byte and 8-byte ones up
# to 2^63), malformed headers, bad HELLOs, and HELLO followed by requests whose bodies are
# mutated or well-typed with odd values (fuzz_values.py).
CASES: Final[dict[str, Case]] = {
    "random bytes": _random_bytes,
    "truncated frame": _truncated,
    "oversized length": _oversized,
    "bad header": _bad_header,
    "bad hello": _bad_hello,
    "mutated body": _mutated_body,
    "odd values": _random_body,
    "group member": _member,
}


class _Healthy:
    """A well-behaved SDK client: sends on its own topic at a steady pace and consumes."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.acked: set[int] = set()
        self.consumed: set[int] = set()
        self.sent = 0
        self.failures: list[str] = []
        self.stop = asyncio.Event()

    async def produce(self) -> None:
        from txbroker_sdk import Client

        async with await Client.connect(self.url, auth_token=self.token) as client:
            while not self.stop.is_set():
                self.sent += 1
                try:
                    await client.send(HEALTHY_TOPIC, str(self.sent).encode())
                except Exception as e:  # any failure of a healthy client is the finding
                    self.failures.append(f"send {self.sent}: {type(e).__name__}: {e}")
                    return
                self.acked.add(self.sent)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 1 / HEALTHY_RATE_PER_S)

    async def consume(self, caught_up: Callable[[], bool]) -> None:
        from txbroker_sdk import Client, Consumer

        async with (
            await Client.connect(self.url, auth_token=self.token) as client,
            Consumer(client, HEALTHY_GROUP, HEALTHY_TOPIC, hold_ms=500) as consumer,
        ):
            while not caught_up():
                for m in await consumer.fetch():
                    self.consumed.add(int(m.body))
                    m.ack()

    def missing(self) -> int:
        return len(self.acked - self.consumed)


async def _setup(url: str, token: str) -> None:
    from txbroker_sdk import Client

    async with await Client.connect(url, auth_token=token) as client:
        for topic in (HEALTHY_TOPIC, *TOPICS):
            await client.create_topic(topic, queues=2, exist_ok=True)


async def fuzz_wire(
    url: str,
    pid: int,
    token: str,
    *,
    cases: int,
    seconds: float,
    seed: int,
    concurrency: int = 8,
    log_path: Path | None = None,
) -> FuzzReport:
    """Run up to ``cases`` cases for up to ``seconds`` against the broker at ``url`` (process
    ``pid``, admin ``token``), ``concurrency`` connections at a time; the tracebacks its log
    at ``log_path`` gains meanwhile are counted."""
    from txbroker_sdk.requests import parse_server_url

    host, port = parse_server_url(url)
    report = FuzzReport("wire", seed)
    await _setup(url, token)
    healthy = _Healthy(url, token)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S

    def caught_up() -> bool:  # after the run: everything acknowledged was consumed
        # The producer first: a send under way as the run ends is acknowledged after it.
        if not (healthy.stop.is_set() and producer.done()):
            return False
        return not healthy.missing() or time.monotonic() > deadline

    producer = asyncio.create_task(healthy.produce())
    consumer = asyncio.create_task(healthy.consume(caught_up))
    report.rss_before_kib = rss_kib(pid)
    log = LogWatch(log_path)
    start = time.monotonic()
    next_case = iter(range(cases))

    async def worker() -> None:
        for case in next_case:
            if time.monotonic() - start > seconds or not alive(pid):
                return
            rng = random.Random(f"{seed}:{case}")
            kind = rng.choice(sorted(CASES))
            try:
                async with asyncio.timeout(CASE_TIMEOUT_S):
                    conn = await _Conn.open(host, port)
                    try:
                        await CASES[kind](conn, rng, token)
                        outcomes = _outcomes(conn)
                    finally:
                        conn.close()
            except _Crash as e:
                report.crash(case, f"{kind}: {e}")
                outcomes = ["crash"]
            except TimeoutError:
                report.crash(case, f"{kind}: no answer or close within {CASE_TIMEOUT_S:.0f} s")
                outcomes = ["crash"]
            except OSError as e:  # written after the broker closed: how it ended, no crash
                outcomes = [f"reset ({type(e).__name__})"]
            report.cases += 1
            report.outcomes.update(f"{kind}: {o}" for o in outcomes)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    report.seconds = time.monotonic() - start
    if not alive(pid):
        report.crash(report.cases, "the broker process exited")
    healthy.stop.set()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    for task in (producer, consumer):
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT_S + 10):
                await task
        except Exception as e:  # the healthy client failed: a finding, not an abort
            healthy.failures.append(f"{type(e).__name__}: {e}")
    report.rss_after_kib = rss_kib(pid)
    report.tracebacks = log.tracebacks()
    for why in healthy.failures:
        report.crash(report.cases, f"healthy client: {why}")
    missing = healthy.missing()
    if missing:
        report.crash(report.cases, f"healthy client: {missing} acknowledged messages not consumed")
    report.healthy = {
        "sent": healthy.sent,
        "acked": len(healthy.acked),
        "consumed": len(healthy.consumed),
        "missing": missing,
    }
    return report
