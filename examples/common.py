"""What the example services share: their command line, signals, and a counters file."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import async_sessionmaker

from txbroker_sdk import Client, Subscribers, create_engine

__all__ = ["StatsFile", "run_subscriber_service", "service_parser", "stop_on_signals"]

Register = Callable[[Subscribers], None]


def service_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--db", required=True, help="the service's database URL (sqlite:// or postgresql://)"
    )
    p.add_argument("--broker", default="txb://127.0.0.1:9876", help="the broker's address")
    p.add_argument("--stats", help="write the service's counters (JSON) into this directory")
    return p


def stop_on_signals() -> asyncio.Event:
    """An event set on SIGTERM or SIGINT: the service finishes what it has in flight, then
    returns from its main (the demo's supervisor stops services with SIGTERM)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


class StatsFile:
    """Counters written atomically every half second and at exit, for the demo's summary. A
    process killed by SIGKILL loses at most its last half second of counts."""

    def __init__(self, folder: str | None, name: str, read: Callable[[], dict[str, int]]) -> None:
        # One file per process: a restarted service's counts add to its killed predecessor's.
        self._path = Path(folder) / f"{name}-{os.getpid()}.json" if folder else None
        self._read = read

    def write(self) -> None:
        if self._path is not None:
            # Written aside and renamed: the demo's summary never reads half a file. No fsync:
            # the counts are for display, and a kill -9 (not a power cut) is what they survive.
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._read()))
            tmp.replace(self._path)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.write()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
        self.write()


async def run_subscriber_service(
    name: str, args: argparse.Namespace, metadata: sa.MetaData, register: Register
) -> int:
    """Create the service's tables, register its handlers, consume until SIGTERM/SIGINT."""
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {name} %(message)s")
    engine = create_engine(args.db)
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
    stop = stop_on_signals()
    async with await Client.connect(args.broker) as client:
        subscribers = Subscribers(client, async_sessionmaker(engine))
        register(subscribers)
        counters = lambda: {  # noqa: E731
            "applied": subscribers.applied,
            "skipped": subscribers.skipped,
            "failed": subscribers.failed,
        }
        stats = StatsFile(args.stats, name, counters)
        print(f"ready {name}", flush=True)
        await asyncio.gather(subscribers.run(stop), stats.run(stop))
    await engine.dispose()
    return 0
