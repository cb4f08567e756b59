"""`txbroker bench tx`: transactional messages end to end against a real broker.

K producers run PREPARE then END_TX (commit, or rollback at --rollback-rate); a fraction
--unknown-rate of transactions never get an END_TX and must be resolved by back-checks. A
check-back server runs inside the bench (real HTTP, signed requests verified); it answers from
the producer's recorded decision, and counts checks that should not have happened: checks of
a transaction its producer had already ended (unexpected) and second checks of one already
answered COMMIT or ROLLBACK (duplicate).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import Route

from txbroker.bench.broker_bench import (
    OnRun,
    _pcts,
    broker_cpu_per,
    repeat_against_broker,
    run_client,
)
from txbroker.runtime.httpserve import serving
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus

GROUP = "bench"
SECRET = "bench-secret"
SETTINGS = "tx_timeout_ms = 1000\ncheck_backoff_base_ms = 500\ncheck_backoff_cap_ms = 1000\n"


@dataclass(frozen=True)
class TxBenchResult:
    flush: str
    transactions: int
    producers: int
    size: int
    seconds: float
    tx_per_s: float
    prepare_latency: dict[str, float]
    end_latency: dict[str, float]
    checks: int
    unexpected_checks: int
    duplicate_checks: int
    resolved_by_check: int


class _Service:
    def __init__(self) -> None:
        self.decided: dict[str, CheckStatus] = {}
        self.ended: set[str] = set()
        self.answered: Counter[str] = Counter()
        self.checks = 0
        self.unexpected = 0
        self.duplicates = 0

    def check(self, req: CheckRequest) -> CheckStatus:
        self.checks += 1
        if req.tx_id in self.ended:
            self.unexpected += 1
        answer = self.decided.setdefault(req.tx_id, CheckStatus.ROLLBACK)
        if self.answered[req.tx_id]:
            self.duplicates += 1
        self.answered[req.tx_id] += 1
        return answer


async def _run(
    url: str,
    http_base: str,
    service: _Service,
    n: int,
    producers: int,
    size: int,
    rollback_rate: float,
    unknown_rate: float,
    flush: str,
    connections: int,
) -> TxBenchResult:
    from txbroker_sdk import Client

    body = os.urandom(size)
    check_url = http_base + "/check"
    # Producers share connections (requests pipeline on each), as services' workers would.
    clients = [await Client.connect(url) for _ in range(min(connections, producers))]
    await clients[0].create_topic("bench-tx", queues=8)
    prep_lat: list[float] = []
    end_lat: list[float] = []
    per = n // producers
    warm = int(per * 0.1)
    unknown: list[str] = []

    async def producer(c: Client, seed: int) -> None:
        rng = random.Random(seed)
        for i in range(per):
            t0 = time.perf_counter()
            tx = await c.prepare("bench-tx", body, producer_group=GROUP, check_url=check_url)
            t1 = time.perf_counter()
            roll = rng.random()
            if roll < unknown_rate:
                service.decided.setdefault(tx.tx_id, CheckStatus.COMMIT)
                unknown.append(tx.tx_id)
                continue
            if roll < unknown_rate + rollback_rate:
                service.decided.setdefault(tx.tx_id, CheckStatus.ROLLBACK)
                await tx.rollback()
            else:
                service.decided.setdefault(tx.tx_id, CheckStatus.COMMIT)
                await tx.commit()
            service.ended.add(tx.tx_id)
            if i >= warm:
                prep_lat.append(t1 - t0)
                end_lat.append(time.perf_counter() - t1)

    t0 = time.perf_counter()
    await asyncio.gather(*(producer(clients[i % len(clients)], i) for i in range(producers)))
    elapsed = time.perf_counter() - t0
    # Wait (bounded) for the back-checks to resolve what producers left open.
    deadline = time.monotonic() + 60
    while (await clients[0].list_transactions(limit=1)).total:
        if time.monotonic() > deadline:
            print("  warning: transactions still open after 60 s", file=sys.stderr)
            break
        await asyncio.sleep(0.2)
    for c in clients:
        await c.close()
    done = per * producers
    return TxBenchResult(
        flush,
        done,
        producers,
        size,
        round(elapsed, 3),
        round(done / elapsed),
        _pcts(prep_lat),
        _pcts(end_lat),
        service.checks,
        service.unexpected,
        service.duplicates,
        len(unknown),
    )


def bench_tx(
    transactions: int,
    producers: int,
    size: int,
    rollback_rate: float,
    unknown_rate: float,
    flush: str,
    runs: int,
    data_root: Path | None = None,
    progress: OnRun | None = None,
    connections: int = 8,
) -> dict[str, object]:
    cfg_dir = Path(tempfile.mkdtemp(prefix="txb-bench-tx-", dir=data_root))
    try:
        cfg = cfg_dir / "broker.toml"
        cfg.write_text(SETTINGS)
        extra = ("--config", str(cfg), "--tx-secret", f"{GROUP}={SECRET}")

        def one(url: str) -> TxBenchResult:
            return run_client(
                _with_check_server(
                    url,
                    transactions,
                    producers,
                    size,
                    rollback_rate,
                    unknown_rate,
                    flush,
                    connections,
                )
            )

        return repeat_against_broker(one, runs, flush, data_root, progress, extra)
    finally:
        shutil.rmtree(cfg_dir, ignore_errors=True)


async def _with_check_server(
    url: str,
    transactions: int,
    producers: int,
    size: int,
    rollback_rate: float,
    unknown_rate: float,
    flush: str,
    connections: int,
) -> TxBenchResult:
    """Run the service's check-back endpoint (real HTTP) beside the producers."""
    service = _Service()
    endpoint = CheckbackEndpoint(service.check, {GROUP: SECRET})
    app = Starlette(routes=[Route("/check", endpoint, methods=["POST"])])
    async with serving(app) as base:
        return await _run(
            url,
            base,
            service,
            transactions,
            producers,
            size,
            rollback_rate,
            unknown_rate,
            flush,
            connections,
        )


__all__ = ["TxBenchResult", "bench_tx", "format_tx"]


def format_tx(res: dict[str, object]) -> str:
    m = res["median"]
    assert isinstance(m, dict)
    p, e = m["prepare_latency"], m["end_latency"]
    return (
        f"tx bench: {int(m['transactions']):,} transactions x {int(m['size'])} B, "
        f"{int(m['producers'])} producers, flush={m['flush']} (median of {res['runs']})\n"
        f"  throughput      {m['tx_per_s']:>10,.0f} transactions/s (prepare + end)\n"
        f"  prepare         p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms  p999 {p['p999_ms']} ms\n"
        f"  end             p50 {e['p50_ms']} ms  p99 {e['p99_ms']} ms  p999 {e['p999_ms']} ms\n"
        f"  back-checks     {int(m['checks'])} made, {int(m['resolved_by_check'])} transactions "
        f"left to them; unexpected {int(m['unexpected_checks'])}, "
        f"duplicate {int(m['duplicate_checks'])}\n"
        f"  broker CPU      {broker_cpu_per(m, 'transactions'):,.1f} us per transaction "
        f"(with its syncer)"
    )
