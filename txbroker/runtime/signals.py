"""Graceful stop: SIGTERM and SIGINT set an event instead of killing the process.

The broker, the outbox relay and the example services each finish what they have in flight
when it is set (answer requests, commit handlers, flush), then return from their main.
"""

from __future__ import annotations

import asyncio
import signal

__all__ = ["stop_on_signals"]


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
