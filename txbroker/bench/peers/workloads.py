"""The three workloads of `bench peers`, written once over :class:`System`.

single (:func:`run_single`), batch (:func:`run_batches`) and e2e (:func:`run_e2e`), each
described where it is run. The first 10% of each run's messages are warm-up, left out of
latencies (as in `bench produce` and `bench e2e`). ``deadline_s`` caps a run: the figures then
cover what was acknowledged in time, and the result says it was capped.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from dataclasses import dataclass

from txbroker.bench.peers.system import System

__all__ = ["E2EFigures", "SendFigures", "run_batches", "run_e2e", "run_single"]

WARMUP_FRACTION = 0.1  # as broker_bench.WARMUP_FRACTION
# After the last send, how long the consumer may take to catch up before the run gives up on
# the rest: far above any healthy broker's latency, well below a test's timeout.
E2E_DRAIN_S = 15.0
_STAMP = struct.Struct(">d")  # e2e bodies start with the sender's perf_counter()


def percentile_ms(values: list[float], q: float) -> float:
    """The ``q`` quantile of seconds, in milliseconds (nearest rank), 0 when empty."""
    if not values:
        return 0.0
    v = sorted(values)
    return round(v[min(len(v) - 1, int(q * len(v)))] * 1000, 3)


@dataclass(frozen=True, slots=True)
class SendFigures:
    messages: int  # acknowledged
    seconds: float
    msgs_per_s: float
    ack_p50_ms: float  # per message for single, per batch for batch
    ack_p99_ms: float
    capped: bool  # stopped by the deadline before all messages were sent


@dataclass(frozen=True, slots=True)
class E2EFigures:
    sent: int
    received: int
    achieved_rate: float  # messages per second the producer kept up
    consumed_rate: float  # received / (first send to last receipt): below the rate, it lagged
    p50_ms: float
    p99_ms: float
    max_ms: float
    capped: bool


def _send_figures(done: int, elapsed: float, lat: list[float], capped: bool) -> SendFigures:
    rate = done / elapsed if elapsed > 0 else 0.0
    return SendFigures(
        done,
        round(elapsed, 3),
        round(rate),
        percentile_ms(lat, 0.5),
        percentile_ms(lat, 0.99),
        capped,
    )


async def run_single(
    system: System, messages: int, window: int, size: int, deadline_s: float
) -> SendFigures:
    """One producer keeps ``window`` single publishes in flight, each awaiting its own
    acknowledgement (txbroker's SEND, RabbitMQ's publisher confirm, JetStream's PubAck).
    """
    body = os.urandom(size)
    warm = int(messages * WARMUP_FRACTION)
    latencies: list[float] = []
    counter = iter(range(messages))
    done = 0
    capped = False
    t0 = time.perf_counter()
    stop_at = t0 + deadline_s

    async def lane() -> None:
        nonlocal done, capped
        for i in counter:
            t = time.perf_counter()
            if t > stop_at:
                capped = True
                return
            await system.publish(body)
            done += 1
            if i >= warm:
                latencies.append(time.perf_counter() - t)

    await asyncio.gather(*(lane() for _ in range(min(window, messages))))
    return _send_figures(done, time.perf_counter() - t0, latencies, capped)


async def run_batches(
    system: System, messages: int, batch: int, window: int, size: int, deadline_s: float
) -> SendFigures:
    """The producer groups messages into batches of ``batch`` (txbroker's SEND_BATCH; RabbitMQ and
    NATS publish the batch and await every confirm or ack) with as many batches in flight as keep
    the same number of messages in flight as ``single``.
    """
    body = os.urandom(size)
    starts = list(range(0, messages, batch))
    warm = int(messages * WARMUP_FRACTION)
    latencies: list[float] = []
    counter = iter(starts)
    done = 0
    capped = False
    t0 = time.perf_counter()
    stop_at = t0 + deadline_s

    async def lane() -> None:
        nonlocal done, capped
        for first in counter:
            n = min(batch, messages - first)
            t = time.perf_counter()
            if t > stop_at:
                capped = True
                return
            await system.publish_batch([body] * n)
            done += n
            if first >= warm:
                latencies.append(time.perf_counter() - t)

    # The same number of messages in flight as `single` with this window.
    lanes = max(1, min(window // batch, len(starts)))
    await asyncio.gather(*(lane() for _ in range(lanes)))
    return _send_figures(done, time.perf_counter() - t0, latencies, capped)


async def run_e2e(
    system: System, rate: int, seconds: float, size: int, deadline_s: float
) -> E2EFigures:
    """One producer publishes at a fixed rate without waiting for acknowledgements in line; a
    consumer on its own connection receives and acknowledges. Each body starts with its send
    time, so the consumer measures publish-to-consume latency."""
    total = max(1, int(rate * seconds))
    pad = os.urandom(max(size - _STAMP.size, 0))
    latencies: list[float] = []
    last_in = 0.0
    all_in = asyncio.Event()

    def on_body(body: bytes) -> None:
        nonlocal last_in
        last_in = time.perf_counter()
        latencies.append(last_in - _STAMP.unpack_from(body)[0])
        if len(latencies) >= total:
            all_in.set()

    await system.subscribe(on_body)
    try:
        await asyncio.sleep(0.5)  # let the consumer attach before the clock starts
        start = time.perf_counter()
        stop_at = start + deadline_s
        sends: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []
        sent = 0
        capped = False

        def settled(task: asyncio.Task[None]) -> None:
            sends.discard(task)
            if not task.cancelled() and task.exception() is not None:
                errors.append(task.exception())  # type: ignore[arg-type]

        for i in range(total):
            target = start + i / rate
            delay = target - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.perf_counter() > stop_at:
                capped = True
                break
            task = asyncio.create_task(system.publish(_STAMP.pack(time.perf_counter()) + pad))
            sends.add(task)
            task.add_done_callback(settled)
            sent += 1
        sent_s = time.perf_counter() - start
        if sends:
            await asyncio.gather(*sends, return_exceptions=True)
        if errors:
            raise errors[0]
        if not capped:
            try:
                async with asyncio.timeout(E2E_DRAIN_S):
                    await all_in.wait()
            except TimeoutError:
                capped = True
    finally:
        await system.unsubscribe()
    measured = latencies[int(len(latencies) * WARMUP_FRACTION) :]
    return E2EFigures(
        sent,
        len(latencies),
        round(sent / sent_s) if sent_s > 0 else 0,
        round(len(latencies) / (last_in - start)) if last_in > start else 0,
        percentile_ms(measured, 0.5),
        percentile_ms(measured, 0.99),
        round(max(measured) * 1000, 3) if measured else 0.0,
        capped,
    )
