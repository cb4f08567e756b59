"""`txbroker bench tx-recovery`: what one old open transaction costs a restart.

A real broker gets one transaction that stays open (its timeout is a day), then N later ones
prepared and ended. The bench waits until the broker has copied the old half forward
(``txbroker.tx.halfcopy``), stops it (SIGTERM: the store has nothing to replay, so the restart
measures the transactions) and times the restart to its ready line, with the records recovery
read. It then puts ``meta/tx.json``'s low-water marks back at the old transaction's half and op
mark, where they stay without copies forward, and times that restart too.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from txbroker.runtime.brokerproc import READY_PREFIX, parse_ready
from txbroker.tx.halfcopy import COMPACT_MIN_SPAN

__all__ = ["TxRecoveryResult", "bench_tx_recovery", "format_tx_recovery"]

GROUP: Final = "bench"
SECRET: Final = "bench-secret"
CHECK_URL: Final = "http://127.0.0.1:9/never"  # no check is due: the old one waits a day
START_TIMEOUT_S: Final = 600.0  # a start reading millions of records takes a while
_RECOVERED: Final = re.compile(
    r"open after recovery \((\d+) half and (\d+) op records read in ([0-9.]+) s\)"
)


@dataclass(frozen=True)
class Restart:
    ready_s: float  # spawn to the ready line
    recovery_s: float  # the transactions' recovery alone (the broker's own figure)
    halves_read: int
    ops_read: int


@dataclass(frozen=True)
class TxRecoveryResult:
    transactions: int
    fill_s: float
    bounded_after_s: float  # from the end of the load until the saved span was bounded
    with_copies: Restart
    marks_at_the_old_one: Restart  # the marks where they stay without copies forward


class _Broker:
    def __init__(self, data: Path, flush: str) -> None:
        self.data = data
        self.log = data.parent / "broker.log"
        self.flush = flush
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> float:
        cmd = [sys.executable, "-m", "txbroker.cli", "serve", "--data-dir", str(self.data)]
        cmd += ["--port", "0", "--http-port", "0", "--flush", self.flush]
        cmd += ["--tx-secret", f"{GROUP}={SECRET}"]
        t0 = time.perf_counter()
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"broker did not start: {line!r}; see {self.log}")
        self.url = parse_ready(line)[0]
        return time.perf_counter() - t0

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None

    def restart(self) -> Restart:
        self.stop()
        ready = self.start()
        found = _RECOVERED.findall(self.log.read_text())
        halves, ops, seconds = found[-1]
        return Restart(round(ready, 2), float(seconds), int(halves), int(ops))

    def state(self) -> dict[str, object]:
        path = self.data / "meta" / "tx.json"
        got: dict[str, object] = json.loads(path.read_bytes()) if path.exists() else {}
        return got


async def _fill(url: str, n: int, producers: int) -> float:
    from txbroker_sdk import Client

    clients = [await Client.connect(url) for _ in range(min(8, producers))]
    try:
        await clients[0].create_topic("old", queues=1)
        await clients[0].create_topic("orders", queues=8)
        await clients[0].prepare(
            "old", b"old", producer_group=GROUP, check_url=CHECK_URL, timeout_ms=86_400_000
        )
        left = iter(range(n))

        async def producer(c: Client) -> None:
            for i in left:
                tx = await c.prepare(
                    "orders", b"x" * 100, producer_group=GROUP, check_url=CHECK_URL
                )
                await (tx.rollback() if i % 10 == 0 else tx.commit())

        t0 = time.perf_counter()
        await asyncio.gather(*(producer(clients[i % len(clients)]) for i in range(producers)))
        return time.perf_counter() - t0
    finally:
        for c in clients:
            await c.close()


def _bounded(state: dict[str, object]) -> bool:
    """The saved span (``half_hi - half_low``) is within compaction's bound for one open
    transaction, and the old half has been copied forward at least once."""
    low, high = state.get("half_low", 0), state.get("half_hi", 0)
    assert isinstance(low, int) and isinstance(high, int)
    return low > 0 and high - low <= COMPACT_MIN_SPAN


def bench_tx_recovery(
    transactions: int, producers: int = 64, flush: str = "async", data_root: Path | None = None
) -> TxRecoveryResult:
    from txbroker.bench.broker_bench import run_client

    root = Path(tempfile.mkdtemp(prefix="txb-bench-txrec-", dir=data_root))
    broker = _Broker(root / "data", flush)
    try:
        broker.start()
        fill = run_client(_fill(broker.url, transactions, producers))
        t0 = time.monotonic()
        while not _bounded(broker.state()):  # the housekeeping's next compaction (10 s)
            if time.monotonic() - t0 > 120:
                raise RuntimeError("recovery's span was not bounded within 120 s")
            time.sleep(0.2)
        copied = time.monotonic() - t0
        after = broker.restart()
        broker.stop()
        # The marks as they stay without copies forward: the old transaction's half (the first %HALF
        # record) and its op mark (0: nothing was in %TXOP before it).
        saved = broker.state()
        saved.update(half_low=0, op_low=0)
        (broker.data / "meta" / "tx.json").write_text(json.dumps(saved))
        before = broker.restart()
        return TxRecoveryResult(transactions, round(fill, 1), round(copied, 1), after, before)
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def format_tx_recovery(r: TxRecoveryResult) -> str:
    def row(name: str, x: Restart) -> str:
        return (
            f"  {name:<34} ready in {x.ready_s:6.2f} s  (recovery {x.recovery_s:6.2f} s, "
            f"{x.halves_read:,} half and {x.ops_read:,} op records read)"
        )

    return "\n".join(
        [
            f"tx recovery bench: 1 old open transaction, then {r.transactions:,} resolved "
            f"({r.fill_s:.1f} s); recovery's span bounded {r.bounded_after_s:.1f} s later",
            row("restart (half copied forward)", r.with_copies),
            row("restart (marks at the old one)", r.marks_at_the_old_one),
        ]
    )


if __name__ == "__main__":  # pragma: no cover - `txbroker bench tx-recovery` is the way in
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    print(format_tx_recovery(bench_tx_recovery(n, data_root=Path(os.getcwd()))))
