"""`txbroker bench produce` and `txbroker bench e2e`: a real broker process, clients over TCP.

produce: K producer connections send N messages, as single sends with a window of requests in
flight per connection, or as batches; reports throughput and acknowledgement latency. e2e: one
producer at a fixed rate, one consumer group member long-polling; each body carries its send
time, so the consumer measures publish-to-consume latency. Both start `txbroker serve` on free
ports in a temporary data directory and stop it after. The first 10% of messages are warm-up
and are left out of the latency figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import struct
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from txbroker.bench.repl_lag import INTERVAL_S, LagSampler
from txbroker.protocol.messages import SendRequest
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker.runtime.gctune import tune_for_serving

T = TypeVar("T")
# Told how many runs are done, of how many: before the first (0) and after each.
OnRun = Callable[[int, int], None]
WARMUP_FRACTION = 0.1
_STAMP = struct.Struct(">d")  # e2e bodies start with the sender's perf_counter()


@contextlib.contextmanager
def broker_process(
    flush: str, data_root: Path | None = None, extra: tuple[str, ...] = ()
) -> Iterator[str]:
    """Run `txbroker serve` on free ports; yield its txb:// address."""
    with _broker(flush, data_root, extra) as (broker, _):
        yield broker.url


@contextlib.contextmanager
def _broker(
    flush: str, data_root: Path | None = None, extra: tuple[str, ...] = (), replicas: int = 0
) -> Iterator[tuple[BrokerProcess, list[BrokerProcess]]]:
    """A broker on free ports and its slaves: with ``replicas``, that many following it (same
    flush mode), started before the run and stopped after it (docs/cluster.md, "Replication")."""
    root = Path(tempfile.mkdtemp(prefix="txb-bench-broker-", dir=data_root))
    broker = BrokerProcess(root / "data", "--flush", flush, *extra)
    slaves: list[BrokerProcess] = []
    try:
        broker.start()
        for i in range(replicas):
            slave = BrokerProcess(root / f"slave{i}", "--flush", flush, "--replica-of", broker.url)
            slaves.append(slave)
            slave.start()
        yield broker, slaves
    finally:
        for slave in slaves:
            slave.stop()
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live children (the broker and its
    syncer), from /proc: a figure that does not grow while a process waits for a core, so it
    compares builds on a busy machine where rates do not. 0.0 where /proc does not say."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    for p in (pid, *map(int, children)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def run_client(coro: Coroutine[Any, Any, T], *, broker_gc: bool = False) -> T:
    """Run the bench's clients on uvloop, like the broker: a slower client loop would be
    measured as broker latency. With ``broker_gc``, under the broker's garbage collector
    settings too (``tune_for_serving``), for a latency figure: a full collection of the
    client's heap (the modules of every system's client; 15-50 ms on a loaded machine, about
    one per 5 s e2e run) stops the producer and the consumer at once, and would be counted
    as the broker's latency."""
    if broker_gc:
        tune_for_serving()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0, "max_ms": 0.0}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 3)

    return {
        "p50_ms": at(0.5),
        "p99_ms": at(0.99),
        "p999_ms": at(0.999),
        "max_ms": round(v[-1] * 1000, 3),
    }


@dataclass(frozen=True)
class ProduceResult:
    flush: str
    messages: int
    size: int
    producers: int
    batch: int
    inflight: int
    seconds: float
    msgs_per_s: float
    mb_per_s: float
    ack_latency: dict[str, float]


async def _produce(
    url: str, flush: str, messages: int, size: int, producers: int, batch: int, inflight: int
) -> ProduceResult:
    from txbroker_sdk import Client

    body = os.urandom(size)
    per = messages // producers
    latencies: list[float] = []
    warm = int(per * WARMUP_FRACTION)
    clients = [await Client.connect(url) for _ in range(producers)]
    await clients[0].create_topic("bench", queues=8)

    async def producer(c: Client) -> None:
        mine: list[float] = []
        if batch > 1:
            for i in range(0, per, batch):
                n = min(batch, per - i)
                t = time.perf_counter()
                await c.send_batch([SendRequest("bench", body)] * n)
                if i >= warm:
                    mine.append(time.perf_counter() - t)
        else:
            sem = asyncio.Semaphore(inflight)
            counter = iter(range(per))

            async def one() -> None:
                for i in counter:
                    async with sem:
                        t = time.perf_counter()
                        await c.send("bench", body)
                        if i >= warm:
                            mine.append(time.perf_counter() - t)

            await asyncio.gather(*(one() for _ in range(inflight)))
        latencies.extend(mine)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer(c) for c in clients))
    elapsed = time.perf_counter() - t0
    for c in clients:
        await c.close()
    done = per * producers
    rate = done / elapsed
    return ProduceResult(
        flush,
        done,
        size,
        producers,
        batch,
        inflight,
        round(elapsed, 3),
        round(rate),
        round(rate * size / 1e6, 2),
        _pcts(latencies),
    )


def bench_produce(
    messages: int,
    size: int,
    producers: int,
    batch: int,
    inflight: int,
    flush: str,
    runs: int,
    data_root: Path | None = None,
    progress: OnRun | None = None,
    replicas: int = 0,
    replication: str = "async",
) -> dict[str, object]:
    """Produce against a broker; with ``replicas``, the same runs twice, in one call: first
    without slaves (``baseline`` in the result), then with that many slaves and
    ``--replication`` (the result itself), run after run in turn, so the two compare on the same
    machine state; ``paired_ratio`` is the median of each pair's with/without ratios. The
    replicated runs also carry ``replication_lag``, the slaves' lag sampled under load."""

    def one(url: str) -> ProduceResult:
        return run_client(_produce(url, flush, messages, size, producers, batch, inflight))

    if not replicas:
        return repeat_against_broker(one, runs, flush, data_root, progress)
    # Alternately without and with slaves, so a change in a shared machine's load during the
    # call falls on both alike; each pair's ratios are kept beside the medians.
    extra = ("--replication", replication)
    without: list[dict[str, Any]] = []
    with_slaves: list[dict[str, Any]] = []
    for i in range(runs):
        if progress is not None:
            progress(2 * i, 2 * runs)
        without.append(_run_once(one, flush, data_root))
        if progress is not None:
            progress(2 * i + 1, 2 * runs)
        with_slaves.append(_run_once(one, flush, data_root, extra, replicas))
    if progress is not None:
        progress(2 * runs, 2 * runs)
    pairs = [
        {
            "msgs_per_s": _ratio(w["msgs_per_s"], b["msgs_per_s"]),
            **{k: _ratio(w["ack_latency"][k], b["ack_latency"][k]) for k in ("p50_ms", "p99_ms")},
        }
        for b, w in zip(without, with_slaves, strict=True)
    ]
    ratio = {k: round(statistics.median(p[k] for p in pairs), 3) for k in pairs[0]}
    return {
        **_summary(with_slaves),
        "replicas": replicas,
        "replication": replication,
        "baseline": _summary(without),
        "paired_ratio": ratio,
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass(frozen=True)
class E2EResult:
    flush: str
    rate: int
    messages: int
    size: int
    achieved_rate: float
    latency: dict[str, float]


async def _e2e(url: str, rate: int, seconds: float, size: int) -> tuple[float, list[float]]:
    from txbroker_sdk import Client, Consumer

    total = int(rate * seconds)
    pad = os.urandom(max(size - _STAMP.size, 0))
    async with await Client.connect(url) as pc, await Client.connect(url) as cc:
        await pc.create_topic("e2e", queues=4)
        received: list[float] = []
        done = asyncio.Event()

        async def consume() -> None:
            async with Consumer(cc, "bench", "e2e", hold_ms=1000, max_messages=256) as consumer:
                while len(received) < total:
                    for m in await consumer.fetch():
                        received.append(time.perf_counter() - _STAMP.unpack_from(m.body)[0])
                        m.ack()
            done.set()

        consumer_task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)  # let the consumer join before the clock starts
        start = time.perf_counter()
        sends: set[asyncio.Task[object]] = set()
        for i in range(total):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            body = _STAMP.pack(time.perf_counter()) + pad
            task: asyncio.Task[object] = asyncio.create_task(pc.send("e2e", body))
            sends.add(task)
            task.add_done_callback(sends.discard)
        await asyncio.gather(*sends)
        sent_s = time.perf_counter() - start
        async with asyncio.timeout(60):
            await done.wait()
        await consumer_task
    return total / sent_s, received[int(total * WARMUP_FRACTION) :]


def bench_e2e(
    rate: int,
    seconds: float,
    size: int,
    flush: str,
    runs: int,
    data_root: Path | None = None,
    progress: OnRun | None = None,
) -> dict[str, object]:
    def one(url: str) -> E2EResult:
        achieved, lat = run_client(_e2e(url, rate, seconds, size), broker_gc=True)
        return E2EResult(flush, rate, int(rate * seconds), size, round(achieved), _pcts(lat))

    return repeat_against_broker(one, runs, flush, data_root, progress)


def repeat_against_broker(
    one: Callable[[str], object],
    runs: int,
    flush: str,
    data_root: Path | None,
    progress: OnRun | None,
    extra: tuple[str, ...] = (),
    replicas: int = 0,
) -> dict[str, object]:
    """Run ``one(url)`` ``runs`` times, each against a fresh broker; summarise the medians.
    With ``replicas``, the slaves' lag behind it is sampled while ``one`` runs (repl_lag.py)."""
    rows = []
    for i in range(runs):
        if progress is not None:
            progress(i, runs)
        rows.append(_run_once(one, flush, data_root, extra, replicas))
    if progress is not None:
        progress(runs, runs)
    return _summary(rows)


def _run_once(
    one: Callable[[str], object],
    flush: str,
    data_root: Path | None,
    extra: tuple[str, ...] = (),
    replicas: int = 0,
) -> dict[str, Any]:
    """``one(url)`` against a fresh broker (and ``replicas`` slaves): its figures as a dict."""
    with _broker(flush, data_root, extra, replicas) as (broker, slaves):
        assert broker.proc is not None
        cpu0 = cpu_seconds(broker.proc.pid)
        lag = LagSampler(broker.http, [s.http for s in slaves])
        with lag if slaves else contextlib.nullcontext(lag):
            row: dict[str, Any] = asdict(one(broker.url))  # type: ignore[call-overload]
        if slaves:
            row["replication_lag"] = lag.summary()
        # The broker's CPU over the run (with its syncer), beside the run's own figures.
        row["broker_cpu_s"] = round(cpu_seconds(broker.proc.pid) - cpu0, 3)
        return row


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, object]:
    """Median of every numeric field (and of every numeric field of dict fields) over runs."""
    med: dict[str, object] = {}
    for k, v in rows[0].items():
        if isinstance(v, dict):
            med[k] = {kk: statistics.median(r[k][kk] for r in rows) for kk in v}
        elif isinstance(v, int | float) and not isinstance(v, bool):
            med[k] = statistics.median(r[k] for r in rows)
        else:
            med[k] = v
    return {"runs": len(rows), "median": med, "all": rows}


def format_produce(res: dict[str, object]) -> str:
    m = res["median"]
    assert isinstance(m, dict)
    lat = m["ack_latency"]
    mode = f"batches of {m['batch']}" if m["batch"] > 1 else f"{m['inflight']} in flight"
    return (
        f"produce bench: {int(m['messages']):,} x {int(m['size'])} B, {int(m['producers'])} "
        f"producer(s), {mode}, flush={m['flush']} (median of {res['runs']})\n"
        f"  throughput    {m['msgs_per_s']:>10,.0f} msgs/s  {m['mb_per_s']:,.1f} MB/s\n"
        f"  ack latency   p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms  "
        f"p999 {lat['p999_ms']} ms  max {lat['max_ms']} ms\n"
        f"  broker CPU    {broker_cpu_per(m, 'messages'):,.1f} us per message (with its syncer)"
    ) + _replication_lines(res)


def _replication_lines(res: dict[str, object]) -> str:
    """With ``--replicas``: the run against slaves beside the baseline without them."""
    base = res.get("baseline")
    if not isinstance(base, dict):
        return ""
    m, b = res["median"], base["median"]
    assert isinstance(m, dict) and isinstance(b, dict)
    lat, blat, lag = m["ack_latency"], b["ack_latency"], m["replication_lag"]
    pr = res["paired_ratio"]
    assert isinstance(pr, dict)
    return (
        f"\n  with {res['replicas']} slave(s), replication={res['replication']}; "
        f"without slaves (baseline, same call, runs in turn):\n"
        f"  throughput    {b['msgs_per_s']:>10,.0f} msgs/s without, {pr['msgs_per_s']:.2f}x "
        f"with slaves\n"
        f"  ack latency   p50 {blat['p50_ms']} ms  p99 {blat['p99_ms']} ms without; "
        f"p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms with slaves "
        f"({pr['p50_ms']:.2f}x, {pr['p99_ms']:.2f}x)\n"
        f"                (with/without: the median of each pair of runs' ratios)\n"
        f"  slave lag     p50 {lag['bytes_p50']:,.0f} B  p99 {lag['bytes_p99']:,.0f} B  "
        f"max {lag['bytes_max']:,.0f} B behind the master's flushed log\n"
        f"                p50 {lag['ms_p50']} ms  p99 {lag['ms_p99']} ms  max {lag['ms_max']} ms "
        f"behind it in time ({lag['samples']:.0f} readings under load, every {INTERVAL_S} s)"
    )


def broker_cpu_per(median: dict[str, Any], unit: str) -> float:
    """The broker's CPU microseconds per ``unit`` (messages, transactions) in a run's median."""
    cpu = float(median.get("broker_cpu_s", 0.0))
    n = float(median.get(unit) or 0)
    return 1e6 * cpu / n if n else 0.0


def format_e2e(res: dict[str, object]) -> str:
    m = res["median"]
    assert isinstance(m, dict)
    lat = m["latency"]
    return (
        f"e2e bench: {m['rate']:,} msgs/s for {int(m['messages']):,} messages of "
        f"{int(m['size'])} B, flush={m['flush']} (median of {res['runs']}), achieved "
        f"{m['achieved_rate']:,.0f} msgs/s\n"
        f"  publish-to-consume  p50 {lat['p50_ms']} ms  p99 {lat['p99_ms']} ms  "
        f"p999 {lat['p999_ms']} ms  max {lat['max_ms']} ms"
    )
