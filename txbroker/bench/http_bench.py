"""`txbroker bench http`: the HTTP API beside the TCP protocol, in the same run, same broker.

Three workloads, each measured over HTTP and over TCP (the SDK) against one `txbroker serve`
child per run, the two alternating which goes first run by run:

    single    one message per request; HTTP: ``concurrency`` requests in flight over as many
              keep-alive connections; TCP: as many single sends in flight on one connection
    batch     ``batch`` messages per request, ``batch_concurrency`` requests in flight each way
              (HTTP: that many connections; TCP: that many clients)
    receive   a topic filled beforehand (untimed), then read to its end: HTTP ``receive`` of up to
              ``batch`` messages and an ``ack`` of their receipts, by ``batch_concurrency``
              receivers; TCP one SDK consumer fetching up to ``batch`` and acking each message

The HTTP client is :class:`HttpConnection`: HTTP/1.1 requests built by hand over asyncio
streams, one in flight per connection, so what is measured is the broker, not a client
library. ``client_ceiling`` measures that client against a trivial server in another process
(a canned answer to every request), the most the client could send on this machine. Latencies
are per request; the first 10% of each workload's requests are warm-up and left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from txbroker.bench.broker_bench import (
    WARMUP_FRACTION,
    OnRun,
    _broker,
    _pcts,
    cpu_seconds,
    run_client,
)
from txbroker.protocol.messages import SendRequest

__all__ = [
    "TARGETS",
    "WORKLOADS",
    "HttpConnection",
    "Settings",
    "bench_http",
    "client_ceiling",
    "format_http",
]

WORKLOADS: Final = ("single", "batch", "receive")
# HTTP / TCP rates the HTTP API is held to (docs/benchmarks.md, "HTTP API").
TARGETS: Final = {"single": 0.5, "batch": 0.7, "receive": 0.5}
_QUEUES: Final = 8  # per topic, as `bench produce` creates its topic
# A receive waits at most this long for messages: long enough never to end empty while the
# topic still holds some, short enough that receivers left waiting at the end stop soon.
_WAIT_MS: Final = 200
# Longer than any run: no message comes back for redelivery while the bench reads.
_INVISIBLE_MS: Final = 600_000


class HttpError(Exception):
    """The broker answered a request with a status the bench did not expect."""


class HttpConnection:
    """One keep-alive HTTP/1.1 connection, one request at a time. Requests are built by hand
    (``prepare``: the head once, the body appended) and answers parsed only as far as the
    status and Content-Length: a lean client, so the broker is what is measured."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    @staticmethod
    def prepare(host: str, path: str, body: bytes) -> bytes:
        """A POST of a JSON ``body`` to ``path``: the bytes to hand to :meth:`request`."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def request(self, raw: bytes, expect: int) -> bytes:
        """Send a prepared request; the answer's body (HttpError unless its status is
        ``expect``)."""
        self._writer.write(raw)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        lower = head.lower()
        at = lower.find(b"content-length:")
        length = int(lower[at + 15 : lower.index(b"\r\n", at)]) if at >= 0 else 0
        body = await self._reader.readexactly(length) if length else b""
        if status != expect:
            raise HttpError(f"HTTP {status}: {body[:300]!r}")
        return body

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


class _Received(msgspec.Struct):
    receipt: str


class _ReceivedMessages(msgspec.Struct):
    messages: list[_Received]


_decode_received = msgspec.json.Decoder(_ReceivedMessages).decode


@dataclass(frozen=True)
class Figures:
    """One workload over one transport in one run."""

    messages: int
    seconds: float
    msgs_per_s: float
    latency: dict[str, float]  # per request
    broker_cpu_us: float  # the broker's CPU (with its syncer) per message


@dataclass(frozen=True)
class Settings:
    messages: int
    size: int
    concurrency: int
    batch: int
    batch_concurrency: int
    flush: str


def _figures(done: int, seconds: float, latencies: list[float], cpu_s: float) -> Figures:
    return Figures(
        done,
        round(seconds, 3),
        round(done / seconds),
        _pcts(latencies),
        round(1e6 * cpu_s / done, 1) if done else 0.0,
    )


def _split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal shares."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _body(size: int) -> bytes:
    """``size`` bytes of printable ASCII: the same message over both transports (utf-8 in the
    JSON, no escaping)."""
    return os.urandom(size).hex()[:size].encode()


# --- HTTP ---


async def _http_publish(
    base: str, topic: str, s: Settings, *, batch: bool
) -> tuple[int, list[float], float]:
    """Publish ``s.messages`` to ``topic``; (messages, latencies, seconds)."""
    host, port = _host_port(base)
    path = f"/v1/topics/{topic}/messages"
    text = _body(s.size).decode()
    per_request = s.batch if batch else 1
    requests = s.messages // per_request
    connections = s.batch_concurrency if batch else s.concurrency
    one = msgspec.json.encode({"body": text})
    payload = msgspec.json.encode({"messages": [{"body": text}] * per_request}) if batch else one
    raw = HttpConnection.prepare(host, path, payload)
    conns = [await HttpConnection.open(host, port) for _ in range(connections)]
    latencies: list[float] = []
    warm = int(requests * WARMUP_FRACTION)
    counter = iter(range(requests))

    async def client(c: HttpConnection) -> None:
        for i in counter:
            t = time.perf_counter()
            await c.request(raw, 201)
            if i >= warm:
                latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    elapsed = time.perf_counter() - t0
    for c in conns:
        await c.close()
    return requests * per_request, latencies, elapsed


async def _http_receive(
    base: str, group: str, topic: str, s: Settings
) -> tuple[int, list[float], float]:
    """Receive and ack ``s.messages`` from ``topic``; latency: a receive and its ack."""
    host, port = _host_port(base)
    prefix = f"/v1/groups/{group}/topics/{topic}"
    receive = HttpConnection.prepare(
        host,
        f"{prefix}/receive",
        msgspec.json.encode({"max": s.batch, "wait_ms": _WAIT_MS, "invisible_ms": _INVISIBLE_MS}),
    )
    conns = [await HttpConnection.open(host, port) for _ in range(s.batch_concurrency)]
    latencies: list[float] = []
    warm = int(s.messages * WARMUP_FRACTION)
    done = 0
    finished = asyncio.Event()

    async def receiver(c: HttpConnection) -> None:
        nonlocal done
        while not finished.is_set():
            t = time.perf_counter()
            got = _decode_received(await c.request(receive, 200)).messages
            if not got:
                continue
            ack = msgspec.json.encode({"receipts": [m.receipt for m in got]})
            await c.request(HttpConnection.prepare(host, f"{prefix}/ack", ack), 200)
            if done >= warm:
                latencies.append(time.perf_counter() - t)
            done += len(got)
            if done >= s.messages:
                finished.set()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(receiver(c)) for c in conns]
    await _until(finished, tasks)
    elapsed = time.perf_counter() - t0
    await _stop(tasks)
    for c in conns:
        await c.close()
    return done, latencies, elapsed


async def _until(finished: asyncio.Event, tasks: Sequence[asyncio.Task[None]]) -> None:
    """Until ``finished`` is set; a task's failure is raised at once."""
    waiter = asyncio.create_task(finished.wait())
    await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:
        if t.done() and (error := t.exception()) is not None:
            waiter.cancel()
            raise error
    await waiter


async def _stop(tasks: Sequence[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _host_port(base: str) -> tuple[str, int]:
    host, _, port = base.removeprefix("http://").partition(":")
    return host, int(port.rstrip("/"))


# --- TCP (the SDK) ---


async def _tcp_publish(
    url: str, topic: str, s: Settings, *, batch: bool
) -> tuple[int, list[float], float]:
    from txbroker_sdk import Client

    body = _body(s.size)
    per_request = s.batch if batch else 1
    requests = s.messages // per_request
    clients = [await Client.connect(url) for _ in range(s.batch_concurrency if batch else 1)]
    latencies: list[float] = []
    warm = int(requests * WARMUP_FRACTION)
    counter = iter(range(requests))
    many = [SendRequest(topic, body)] * per_request

    async def sender(c: Any) -> None:
        for i in counter:
            t = time.perf_counter()
            if batch:
                await c.send_batch(many)
            else:
                await c.send(topic, body)
            if i >= warm:
                latencies.append(time.perf_counter() - t)

    if batch:
        senders = [sender(c) for c in clients]
    else:
        senders = [sender(clients[0]) for _ in range(s.concurrency)]
    t0 = time.perf_counter()
    await asyncio.gather(*senders)
    elapsed = time.perf_counter() - t0
    for c in clients:
        await c.close()
    return requests * per_request, latencies, elapsed


async def _tcp_receive(
    url: str, group: str, topic: str, s: Settings
) -> tuple[int, list[float], float]:
    """One SDK consumer reads ``s.messages``, acking each; latency: a fetch."""
    from txbroker_sdk import Client, Consumer

    latencies: list[float] = []
    warm = int(s.messages * WARMUP_FRACTION)
    done = 0
    async with await Client.connect(url) as c:
        consumer = Consumer(c, group, topic, max_messages=s.batch, hold_ms=_WAIT_MS)
        async with consumer:
            t0 = time.perf_counter()
            while done < s.messages:
                t = time.perf_counter()
                got = await consumer.fetch()
                for m in got:
                    m.ack()
                if got and done >= warm:
                    latencies.append(time.perf_counter() - t)
                done += len(got)
            elapsed = time.perf_counter() - t0
            await consumer.commit()
    return done, latencies, elapsed


async def _fill(url: str, topic: str, s: Settings) -> None:
    """``s.messages`` in ``topic`` before the receive workloads read it (untimed)."""
    from txbroker_sdk import Client

    body = _body(s.size)
    async with await Client.connect(url) as c:
        for n in _split(s.messages, max(1, s.messages // 256)):
            await c.send_batch([SendRequest(topic, body)] * n)


# --- one run ---

Measure = Callable[[], Awaitable[tuple[int, list[float], float]]]


async def _one_run(url: str, http: str, pid: int, s: Settings, http_first: bool) -> dict[str, Any]:
    """Every workload over both transports against one broker: {workload: {http, tcp}}."""
    from txbroker_sdk import Client

    topics = {f"{w}-{t}": f"bench-{w}-{t}" for w in WORKLOADS for t in ("http", "tcp")}
    async with await Client.connect(url) as admin:
        for topic in topics.values():
            await admin.create_topic(topic, queues=_QUEUES)
    await _fill(url, topics["receive-http"], s)
    await _fill(url, topics["receive-tcp"], s)

    def measures(workload: str) -> dict[str, Measure]:
        th, tt = topics[f"{workload}-http"], topics[f"{workload}-tcp"]
        if workload == "receive":
            return {
                "http": lambda: _http_receive(http, "bench-http", th, s),
                "tcp": lambda: _tcp_receive(url, "bench-tcp", tt, s),
            }
        batch = workload == "batch"
        return {
            "http": lambda: _http_publish(http, th, s, batch=batch),
            "tcp": lambda: _tcp_publish(url, tt, s, batch=batch),
        }

    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        row: dict[str, Any] = {}
        order = ("http", "tcp") if http_first else ("tcp", "http")
        for transport in order:
            cpu0 = cpu_seconds(pid)
            done, latencies, seconds = await measures(workload)[transport]()
            row[transport] = asdict(_figures(done, seconds, latencies, cpu_seconds(pid) - cpu0))
        row["ratio"] = round(_ratio(row["http"]["msgs_per_s"], row["tcp"]["msgs_per_s"]), 3)
        out[workload] = row
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def bench_http(
    s: Settings,
    runs: int,
    data_root: Path | None = None,
    progress: OnRun | None = None,
    *,
    ceiling: bool = True,
) -> dict[str, Any]:
    """``runs`` runs, each against a fresh broker, HTTP first in even runs and TCP first in
    odd ones; the medians, with each workload's ratio the median of the runs' own ratios."""
    rows: list[dict[str, Any]] = []
    for i in range(runs):
        if progress is not None:
            progress(i, runs)
        with _broker(s.flush, data_root) as (broker, _):
            assert broker.proc is not None
            pid = broker.proc.pid
            rows.append(run_client(_one_run(broker.url, broker.http, pid, s, i % 2 == 0)))
    if progress is not None:
        progress(runs, runs)
    median: dict[str, Any] = {}
    for w in WORKLOADS:
        median[w] = {t: _median_of([r[w][t] for r in rows]) for t in ("http", "tcp")} | {
            "ratio": statistics.median(r[w]["ratio"] for r in rows),
            "target": TARGETS[w],
        }
    res: dict[str, Any] = {"settings": asdict(s), "runs": runs, "median": median, "all": rows}
    if ceiling:
        res["client_ceiling"] = client_ceiling(s)
    return res


def _median_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    med: dict[str, Any] = {}
    for k, v in rows[0].items():
        if isinstance(v, dict):
            med[k] = {kk: statistics.median(r[k][kk] for r in rows) for kk in v}
        else:
            med[k] = statistics.median(r[k] for r in rows)
    return med


# --- the client's ceiling ---

# A receipt as the broker answers a single publish: what the client parses per request.
_CANNED_BODY: Final = (
    b'{"message_id":"00000000000000000000000000000000","topic":"bench","queue":0,'
    b'"offset":0,"duplicate":false}'
)
_CANNED: Final = (
    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(_CANNED_BODY)}\r\n\r\n".encode()
    + _CANNED_BODY
)


class _CannedProtocol(asyncio.Protocol):
    """Answers every request (head and Content-Length body) with the same 201."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: Any = None  # uvloop's transports are not asyncio.Transport's kin

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        buf = self._buf + data
        answers = 0
        while (end := buf.find(b"\r\n\r\n")) >= 0:
            head = buf[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            answers += 1
        self._buf = buf
        if answers:
            self._transport.write(_CANNED * answers)


def _serve_canned(sock: socket.socket) -> None:  # pragma: no cover - in a child process
    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_CannedProtocol, sock=sock)
        await server.serve_forever()

    run_client(serve())


def client_ceiling(s: Settings) -> dict[str, float]:
    """The client's single-publish rate (``s.concurrency`` connections) against a trivial
    server in another process, and the client's own CPU per request."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    server = multiprocessing.get_context("fork").Process(
        target=_serve_canned, args=(sock,), daemon=True
    )
    server.start()
    sock.close()
    try:
        cpu0 = time.process_time()
        done, latencies, seconds = run_client(
            _http_publish(f"http://127.0.0.1:{port}", "bench", s, batch=False)
        )
        cpu = time.process_time() - cpu0
    finally:
        server.terminate()
        server.join(10)
    return {
        "requests_per_s": round(done / seconds),
        "client_cpu_us": round(1e6 * cpu / done, 1),
        "p50_ms": _pcts(latencies)["p50_ms"],
    }


# --- the table ---

_TITLES: Final = {
    "single": "single, {concurrency} in flight",
    "batch": "batches of {batch}, {batch_concurrency} in flight",
    "receive": "receive+ack, {batch} a receive",
}


def format_http(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = [
        f"http bench: {s['messages']:,} x {s['size']} B per workload and transport, "
        f"flush={s['flush']} (median of {res['runs']}; HTTP and TCP in turn, same broker)",
        f"  {'workload':<30} {'HTTP msgs/s':>11} {'p50 ms':>7} {'p99 ms':>7}  "
        f"{'TCP msgs/s':>10} {'p50 ms':>7} {'p99 ms':>7}  {'HTTP/TCP':>8}  target",
    ]
    for w in WORKLOADS:
        m = res["median"][w]
        h, t = m["http"], m["tcp"]
        met = "met" if m["ratio"] >= m["target"] else "missed"
        lines.append(
            f"  {_TITLES[w].format(**s):<30} {h['msgs_per_s']:>11,.0f} "
            f"{h['latency']['p50_ms']:>7.2f} {h['latency']['p99_ms']:>7.2f}  "
            f"{t['msgs_per_s']:>10,.0f} {t['latency']['p50_ms']:>7.2f} "
            f"{t['latency']['p99_ms']:>7.2f}  {m['ratio']:>7.2f}x  >= {m['target']}x {met}"
        )
    lines.append(
        "  broker CPU per message (us):   "
        + ", ".join(
            f"{w} {res['median'][w]['http']['broker_cpu_us']:.0f} HTTP / "
            f"{res['median'][w]['tcp']['broker_cpu_us']:.0f} TCP"
            for w in WORKLOADS
        )
    )
    if "client_ceiling" in res:
        c = res["client_ceiling"]
        lines.append(
            f"  client ceiling: {c['requests_per_s']:,.0f} requests/s against a trivial server "
            f"({s['concurrency']} connections; {c['client_cpu_us']:.1f} us of client CPU per "
            "request)"
        )
    return "\n".join(lines)
