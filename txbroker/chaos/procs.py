"""The campaign's child processes: a service (:mod:`txbroker.chaos.service`) whose stdout lines
are read as they come, and free loopback ports.

Every wait is bounded; every process started is stopped (SIGTERM, then SIGKILL after a bound)
by whoever started it, also when the campaign fails half-way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["Child", "Progress", "free_port"]

START_TIMEOUT_S: Final = 60.0  # a cold interpreter importing SQLAlchemy on a busy 2-core box
STOP_TIMEOUT_S: Final = 30.0


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: it is bound again after each
    restart, and meanwhile an outgoing connection could take a port from that range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:
        low = 32768
    for _ in range(200):
        port = random.randrange(max(low - 12_000, 1024), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free loopback port found")


class Progress:
    """Counters the campaign waits on: each change wakes the waiters (no polling)."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self.counts: dict[str, int] = {}

    async def bump(self, name: str, n: int = 1) -> None:
        async with self._cond:
            self.counts[name] = self.counts.get(name, 0) + n
            self._cond.notify_all()

    def get(self, name: str) -> int:
        return self.counts.get(name, 0)

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """True once ``predicate()`` holds; False after ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s), self._cond:
                await self._cond.wait_for(predicate)
            return True
        except TimeoutError:
            return False

    async def poke(self) -> None:
        """Wake the waiters to look again (something they watch changed outside)."""
        async with self._cond:
            self._cond.notify_all()


class Child:
    """``python -m txbroker.chaos ROLE ARGS``: stderr to ``log_path``, stdout read line
    by line (``placed ID`` lines into ``placed`` and the ``progress`` counter ``placed``)."""

    def __init__(
        self, role: str, args: list[str], log_path: Path, progress: Progress, env: dict[str, str]
    ) -> None:
        self.role = role
        self.args = args
        self.log_path = log_path
        self.progress = progress
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.placed: set[str] = set()
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Event = asyncio.Event()

    async def start(self, faults: str = "", extra: tuple[str, ...] = ()) -> Child:
        """Start it (``faults``: its TXB_FAULTS; ``extra``: more arguments); return once it
        printed READY."""
        env = {**os.environ, **self.env, "TXB_FAULTS": faults}
        self._ready = asyncio.Event()
        with open(self.log_path, "a") as log:  # noqa: ASYNC230 - opening a log, no wait
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "txbroker.chaos",
                self.role,
                *self.args,
                *extra,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                env=env,
            )
        self._reader = asyncio.create_task(self._read(self.proc))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await self._ready.wait()
        except TimeoutError:
            await self.stop()
            raise RuntimeError(f"{self.role} did not start; see {self.log_path}") from None
        if self.proc.returncode is not None:
            raise RuntimeError(f"{self.role} exited at start; see {self.log_path}")
        return self

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            text = line.decode().strip()
            if text == "READY":
                self._ready.set()
            elif text.startswith("placed "):
                self.placed.add(text[7:])
                await self.progress.bump(f"{self.role}.placed")
            elif text == "DONE":
                await self.progress.bump(f"{self.role}.done")
        self._ready.set()  # ended: whoever waits for READY looks at the exit code
        await self.progress.bump(f"{self.role}.exits")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout_s``."""
        assert self.proc is not None
        try:
            async with asyncio.timeout(timeout_s):
                code = await self.proc.wait()
        except TimeoutError:
            return None
        if self._reader is not None:
            await self._reader  # every line it printed before it died is counted
        return code

    async def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
        if self.proc is not None:
            await self.wait_exit(STOP_TIMEOUT_S)

    def signal(self, sig: int) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(sig)

    async def stop(self) -> int | None:
        """SIGTERM and wait (bounded); SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None:
            return None
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            if await self.wait_exit(STOP_TIMEOUT_S) is None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.wait_exit(STOP_TIMEOUT_S)
        elif self._reader is not None:
            await self._reader
        return self.proc.returncode
