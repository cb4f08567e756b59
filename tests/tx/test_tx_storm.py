"""20k unresolved transactions against an endpoint that answers UNKNOWN: checks stay within the
configured concurrency and rate, and the broker keeps serving normal traffic."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.httpserver import serve_app
from tests.tx.conftest import GROUP, tx_broker
from txbroker_sdk import Client

HALF_MESSAGES = 20_000
CONCURRENCY = 8
RATE = 200  # per second, per endpoint
STORM = f"""
tx_timeout_ms = 200
check_backoff_base_ms = 1000
check_backoff_cap_ms = 2000
max_checks = 15
check_timeout_ms = 60000
check_deadline_ms = 60000
check_concurrency = {CONCURRENCY}
check_rate_per_s = {RATE}
"""
# The endpoint answers in 20 ms; the timeouts are far beyond that so that no check is ever given
# up while its request is still being handled: the endpoint's own count of requests in flight is
# then the broker's, even when a machine busy with other tests holds the endpoint up for a while.
SENDS = 40  # ordinary sends while the storm runs


@pytest.mark.slow
async def test_check_storm_is_bounded(tmp_path: Path) -> None:
    inflight = 0
    peak = 0
    arrivals: list[float] = []

    checked = asyncio.Event()  # a check arrived since it was cleared

    async def unknown(_: Request) -> Response:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)
        arrivals.append(time.monotonic())
        checked.set()
        try:
            await asyncio.sleep(0.02)  # a service taking 20 ms: lets concurrency show
            return JSONResponse({"status": "UNKNOWN"})
        finally:
            inflight -= 1

    app = Starlette(routes=[Route("/c", unknown, methods=["POST"])])
    b = tx_broker(tmp_path / "storm", settings=STORM).start()
    try:
        async with serve_app(app) as base, await Client.connect(b.url) as c:
            await c.create_topic("orders", queues=4)
            await c.create_topic("normal", queues=1)
            sem = asyncio.Semaphore(256)

            async def prepare(i: int) -> None:
                async with sem:
                    await c.prepare(
                        "orders", b"x" * 64, producer_group=GROUP, check_url=base + "/c"
                    )

            await asyncio.gather(*(prepare(i) for i in range(HALF_MESSAGES)))
            assert (await c.list_transactions(limit=1)).total == HALF_MESSAGES
            # Normal traffic while the storm runs: sends keep being answered.
            latencies = []
            window_start = time.monotonic()
            for _ in range(SENDS):
                t = time.perf_counter()
                await c.send("normal", b"still serving")
                latencies.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)  # a steady trickle of ordinary sends
            checked.clear()
            await asyncio.wait_for(checked.wait(), 30)  # the storm went on past the last send
    finally:
        b.stop()
    assert peak <= CONCURRENCY, peak
    assert len(arrivals) > RATE  # the storm did run
    # Per-second rate, measured over whole seconds of arrivals (a little slack for timing).
    start = arrivals[0]
    per_second: dict[int, int] = {}
    for t in arrivals:
        per_second[int(t - start)] = per_second.get(int(t - start), 0) + 1
    assert max(per_second.values()) <= RATE * 1.1, per_second
    assert len(arrivals) <= RATE * (arrivals[-1] - start + 1) * 1.1
    assert arrivals[0] < window_start  # and was on before the first
    # Answered while the storm runs, not queued behind it (it lasts minutes: 20,000 halves
    # checked 15 times at 200/s). Loose bounds: a machine busy with other tests stretches every
    # send; how fast a send is answered is for the benches.
    latencies.sort()
    assert len(latencies) == SENDS
    assert latencies[SENDS // 2] < 0.5 and latencies[-1] < 5.0, latencies[-5:]
