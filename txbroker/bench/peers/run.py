"""`txbroker bench peers`: the same workloads against txbroker and the brokers users would pick
instead, in one run, in interleaved rounds.

Each round starts a fresh `txbroker serve` per flush mode and runs every workload against every
system, the systems' order rotated by one per round, so no system always runs first (on a warm
or a cold page cache) or right after the heaviest one. The figures are the medians over the
rounds, and the ratios of txbroker's medians to each peer's. A peer that cannot be reached or
fails is skipped or left out with one line; txbroker failing is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import signal
import statistics
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any, TypeVar

from txbroker.bench.broker_bench import run_client
from txbroker.bench.peers.jetstream import JetStreamSystem
from txbroker.bench.peers.options import PeersOptions
from txbroker.bench.peers.rabbitmq import RabbitMQSystem
from txbroker.bench.peers.system import PeerUnavailable, System, reason
from txbroker.bench.peers.txb import TxbrokerSystem
from txbroker.bench.peers.workloads import E2EFigures, SendFigures, run_batches, run_e2e, run_single

__all__ = ["RATIO_METRICS", "bench_peers"]

T = TypeVar("T")
Say = Callable[[str], None]  # a line for the person watching: progress, a skipped peer
# The figure each ratio compares, per workload: txbroker's median over the peer's median.
# Throughput: above 1, txbroker is faster. Latency: below 1, txbroker's is lower.
RATIO_METRICS: dict[str, tuple[str, str]] = {
    "single": ("single", "msgs_per_s"),
    "batch": ("batch", "msgs_per_s"),
    "e2e_p50": ("e2e", "p50_ms"),
    "e2e_p99": ("e2e", "p99_ms"),
}


def bench_peers(opts: PeersOptions, say: Say | None = None) -> dict[str, object]:
    """Run the whole comparison; return one JSON-ready summary (see :func:`_summary`).

    Each (round, workload, system) gets a queue, topic or stream of its own, named
    ``txb-bench-<run id>-r<round>-<workload>``, deleted right after; a last sweep deletes
    whatever a failure left. A peer that fails mid-run is left out of the rounds after."""
    return run_client(_cancellable(_bench(opts, say or (lambda _line: None))), broker_gc=True)


async def _cancellable(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` with SIGTERM cancelling it like Ctrl-C does, so its cleanup still runs: the
    brokers it started stop and the queues and streams it created on the shared servers go."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


def _systems(opts: PeersOptions) -> list[System]:
    out: list[System] = [TxbrokerSystem(f, opts.data_root) for f in opts.flush]
    for key in opts.peers:
        if key == "rabbitmq-classic":
            out.append(RabbitMQSystem("classic", opts.rabbitmq_url))
        elif key == "rabbitmq-quorum":
            out.append(RabbitMQSystem("quorum", opts.rabbitmq_url))
        elif key == "nats-file":
            out.append(JetStreamSystem(opts.nats_url))
    return out


async def _one(system: System, workload: str, opts: PeersOptions) -> SendFigures | E2EFigures:
    if workload == "single":
        return await run_single(system, opts.messages, opts.window, opts.size, opts.duration_s)
    if workload == "batch":
        return await run_batches(
            system, opts.messages, opts.batch, opts.window, opts.size, opts.duration_s
        )
    assert workload == "e2e", workload
    return await run_e2e(system, opts.rate, opts.e2e_seconds, opts.size, opts.duration_s)


def _headline(fig: SendFigures | E2EFigures) -> str:
    if isinstance(fig, SendFigures):
        text = f"{fig.msgs_per_s:,.0f} msgs/s"
    else:
        text = f"p50 {fig.p50_ms} ms, p99 {fig.p99_ms} ms at {fig.achieved_rate:,.0f} msgs/s"
    return text + (" (capped)" if fig.capped else "")


async def _bench(opts: PeersOptions, say: Say) -> dict[str, object]:
    prefix = f"txb-bench-{secrets.token_hex(4)}"
    systems = _systems(opts)
    status: dict[str, str] = {}
    reasons: dict[str, str] = {}
    live: list[System] = []
    for s in systems:
        try:
            await s.connect()
        except PeerUnavailable as e:
            status[s.info.key], reasons[s.info.key] = "skipped", str(e)
            say(f"skipped {s.info.label}: {e}")
            continue
        status[s.info.key] = "measured"
        live.append(s)
    per_round: dict[str, dict[str, list[dict[str, object]]]] = {
        w: {s.info.key: [] for s in live} for w in opts.workloads
    }
    steps = opts.rounds * len(opts.workloads) * len(live)
    step = 0
    try:
        for r in range(opts.rounds):
            shift = r % len(live) if live else 0
            order = live[shift:] + live[:shift]
            brokers = [s for s in order if isinstance(s, TxbrokerSystem)]
            try:
                for b in brokers:
                    await b.start_broker()
                for workload in opts.workloads:
                    name = f"{prefix}-r{r + 1}-{workload}"
                    for s in order:
                        step += 1
                        if status[s.info.key] != "measured":
                            continue
                        t0 = time.monotonic()
                        try:
                            fig = await _measure(s, name, workload, opts)
                        except Exception as e:
                            if s.info.is_txbroker:
                                raise
                            status[s.info.key], reasons[s.info.key] = "failed", reason(e)
                            say(
                                f"{s.info.label} failed in round {r + 1} ({workload}): "
                                f"{reason(e)}; left out of the rest of the run"
                            )
                            continue
                        per_round[workload][s.info.key].append(asdict(fig))
                        say(
                            f"[{step}/{steps}] round {r + 1}/{opts.rounds} {workload:<6} "
                            f"{s.info.label}: {_headline(fig)} ({time.monotonic() - t0:.1f} s)"
                        )
            finally:
                for b in brokers:
                    await b.stop_broker()
    finally:
        await _sweep(live, prefix)
        for s in live:
            await s.disconnect()
    return _summary(opts, prefix, systems, status, reasons, per_round)


async def _measure(
    s: System, name: str, workload: str, opts: PeersOptions
) -> SendFigures | E2EFigures:
    await s.create(name)
    try:
        return await _one(s, workload, opts)
    finally:
        await s.delete(name)


async def _sweep(live: list[System], prefix: str) -> None:
    """Delete what a failure may have left on the shared servers."""
    for s in live:
        with contextlib.suppress(Exception):
            await s.sweep(prefix)


def _sig(x: float) -> float:
    """Four significant digits: a latency ratio can be 0.0007 (a peer that lags by seconds)."""
    return float(f"{x:.4g}")


def _median_of(rows: list[dict[str, object]]) -> dict[str, object]:
    med: dict[str, object] = {}
    for k, v in rows[0].items():
        if isinstance(v, bool):
            med[f"{k}_rounds"] = sum(1 for r in rows if r[k])  # how many rounds were capped
        elif isinstance(v, int | float):
            med[k] = statistics.median(float(r[k]) for r in rows)  # type: ignore[arg-type]
    return med


def _summary(
    opts: PeersOptions,
    prefix: str,
    systems: list[System],
    status: dict[str, str],
    reasons: dict[str, str],
    per_round: dict[str, dict[str, list[dict[str, object]]]],
) -> dict[str, object]:
    """The run as JSON::

    {"options": {...}, "prefix": "txb-bench-<id>" (of every name the run used),
     "systems": [{key, label, durability, version, status, reason}],
     "results": {workload: {key: {"median": {...}, "rounds": [...]}}},
     "ratios": {"single"|"batch"|"e2e_p50"|"e2e_p99": {txbroker key: {other: ratio}}}}
    """
    results: dict[str, dict[str, object]] = {}
    medians: dict[str, dict[str, dict[str, object]]] = {}
    for workload, by_key in per_round.items():
        results[workload] = {}
        medians[workload] = {}
        for key, rows in by_key.items():
            if rows:
                medians[workload][key] = _median_of(rows)
                results[workload][key] = {"median": medians[workload][key], "rounds": rows}
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    txb = [s.info.key for s in systems if s.info.is_txbroker]
    for name, (workload, metric) in RATIO_METRICS.items():
        if workload not in medians:
            continue
        ratios[name] = {}
        for t in txb:
            tm = medians[workload].get(t)
            if tm is None:
                continue
            ratios[name][t] = {
                other: _sig(float(tm[metric]) / float(om[metric]))  # type: ignore[arg-type]
                for other, om in medians[workload].items()
                if other != t and float(om[metric]) > 0  # type: ignore[arg-type]
            }
    return {
        "options": opts.public(),
        "prefix": prefix,
        "systems": [
            {
                "key": s.info.key,
                "label": s.info.label,
                "durability": s.info.durability,
                "version": s.version,
                "status": status.get(s.info.key, "skipped"),
                "reason": reasons.get(s.info.key),
            }
            for s in systems
        ],
        "results": results,
        "ratios": ratios,
    }
