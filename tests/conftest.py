"""Shared fixtures. Tests use real files, real processes and (later) real servers."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from txbroker.store import FlushMode, MessageStore, StoreConfig

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``txbroker ARGS`` as a user would: a real process, its exit code and output."""
    return subprocess.run(
        [sys.executable, "-m", "txbroker.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=timeout,
        env={**os.environ, **env} if env else None,
    )


def small_config(data_dir: Path, **overrides: object) -> StoreConfig:
    """A store with small files, so rolling, retention and rebuilds happen in tests quickly."""
    kw: dict[str, object] = {
        "segment_bytes": 256 * 1024,
        "max_body_bytes": 64 * 1024,
        "cq_entries_per_file": 1000,
        "index_slots": 257,
        "index_capacity": 5000,
        "flush": FlushMode.SYNC,
    }
    kw.update(overrides)
    return StoreConfig(data_dir, **kw)  # type: ignore[arg-type]


OpenStore = Callable[..., Awaitable[MessageStore]]


@pytest.fixture
async def open_store(tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Open stores on ``tmp_path/store`` (or a given dir); every one still open is closed."""
    opened: list[MessageStore] = []

    async def _open(data_dir: Path | None = None, **overrides: object) -> MessageStore:
        store = await MessageStore.open(small_config(data_dir or tmp_path / "store", **overrides))
        opened.append(store)
        return store

    yield _open
    for s in opened:
        await s.close()


class BrokerProcess:
    """A real `txbroker serve` child process on a free port."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.http = ""
        self.log_path = data_dir.parent / "broker.log"

    def start(self) -> BrokerProcess:
        cmd = [
            sys.executable,
            "-m",
            "txbroker.cli",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            "0",
            "--http-port",
            "0",
            # Small files: every test broker preallocates its segments and index files, and
            # the defaults (256 MiB + 52 MiB, twice) would fill a CI disk over a whole run.
            "--segment-mib",
            "8",
            *self.extra,
        ]
        # stderr goes to a file, not a pipe nobody reads: a chatty broker must never block on it.
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            env = {**os.environ, "TXB_INDEX_CAPACITY": "65536"}  # 1.7 MiB index files
            self.proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("txbroker ready"):
            self.stop()
            raise RuntimeError(f"broker did not start: {line!r}; see {self.log_path}")
        addr = line.split("tcp=")[1].split()[0]
        self.url = f"txb://{addr}"
        self.http = "http://" + line.split("http=")[1].split()[0]
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._close_pipes()

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM and wait (bounded); SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._close_pipes()
        return self.proc.returncode

    def _close_pipes(self) -> None:
        assert self.proc is not None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker").start()
    yield b
    b.stop()
