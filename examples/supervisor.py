"""Run the demo's processes, restart the ones a fault killed, stop them all at the end.

A process that dies by SIGKILL was killed by an armed crash point (``TXB_FAULTS``): it is
restarted, with the next fault armed while the service's kill budget lasts. Any other exit
while the demo runs is a real failure and ends the demo with the process's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DemoFailed", "Process", "Supervisor"]

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class DemoFailed(Exception):
    pass


@dataclass
class Process:
    name: str
    args: list[str]  # after `python -m`
    ready: str | None = "ready"  # the stdout line prefix that says it serves; None: don't wait
    faults: Callable[[], str] | None = None  # TXB_FAULTS for the next start (None: none)
    kill_budget: int = 0  # how many fault kills to allow; then it runs without faults
    kills: int = 0
    ready_line: str = ""
    proc: asyncio.subprocess.Process | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._procs: list[Process] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.failure: DemoFailed | None = None
        self.failed = asyncio.Event()

    async def start(self, p: Process) -> Process:
        self._procs.append(p)
        await self._spawn(p)
        self._watchers.append(asyncio.create_task(self._watch(p)))
        return p

    async def _spawn(self, p: Process) -> None:
        env = dict(os.environ)
        env.pop("TXB_FAULTS", None)
        if p.faults is not None and p.kills < p.kill_budget:
            env["TXB_FAULTS"] = p.faults()
        # stderr to a file (a pipe nobody reads could block the child); the child keeps its
        # own descriptor, so ours is closed once it is started.
        with (self._logs / f"{p.name}.log").open("ab") as log:
            p.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *p.args, stdout=asyncio.subprocess.PIPE, stderr=log, env=env
            )
        if p.ready is None:
            return
        assert p.proc.stdout is not None
        try:
            line = await asyncio.wait_for(p.proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if not line.decode().startswith(p.ready):
            raise DemoFailed(f"{p.name} did not start: {self.log_tail(p.name)}")
        p.ready_line = line.decode().strip()

    async def _watch(self, p: Process) -> None:
        while True:
            assert p.proc is not None
            code = await p.proc.wait()
            if self._stopping:
                return
            if code != -signal.SIGKILL:
                self.failure = DemoFailed(f"{p.name} exited with {code}: {self.log_tail(p.name)}")
                self.failed.set()
                return
            p.kills += 1
            try:
                await self._spawn(p)
            except DemoFailed as e:
                self.failure = e
                self.failed.set()
                return

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self._logs / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return f"see {path}:\n" + "\n".join(text.splitlines()[-lines:])

    async def stop_all(self) -> None:
        """SIGTERM everything (they finish in-flight work), newest first; SIGKILL stragglers."""
        self._stopping = True
        for p in reversed(self._procs):
            if p.proc is not None and p.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.proc.terminate()
                try:
                    await asyncio.wait_for(p.proc.wait(), STOP_TIMEOUT_S)
                except TimeoutError:
                    p.proc.kill()
                    await p.proc.wait()
        for w in self._watchers:
            w.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
