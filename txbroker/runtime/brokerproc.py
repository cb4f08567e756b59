"""A broker as a child process (`txbroker serve`): for benchmarks and tests.

It starts on free ports (unless ``extra`` names them), waits for the ready line, and parses the
addresses from it; the ready line's layout is written once, here and in ``server/app.py``.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["READY_PREFIX", "BrokerProcess", "parse_ready", "terminate"]

READY_PREFIX = "txbroker ready"
START_TIMEOUT_S = 30.0


def parse_ready(line: str) -> tuple[str, str]:
    """``txbroker ready tcp=H:P http=H:P ...`` to (txb://H:P, http://H:P); with ``tls=on``,
    (txbs://H:P, https://H:P)."""
    if not line.startswith(READY_PREFIX):
        raise ValueError(f"not the broker's ready line: {line!r}")
    fields = dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
    if fields.get("tls") == "on":
        return f"txbs://{fields['tcp']}", f"https://{fields['http']}"
    return f"txb://{fields['tcp']}", f"http://{fields['http']}"


def terminate(proc: subprocess.Popen[str], timeout_s: float = 30) -> None:
    """SIGTERM a child and wait (bounded); SIGKILL it if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


class BrokerProcess:
    """`txbroker serve --data-dir DATA_DIR --port 0 --http-port 0 *extra`; stderr goes to
    ``<data_dir>.log`` beside the data directory (a file, not a pipe nobody reads: a chatty
    broker must never block on it). ``nofile`` starts it with that (soft, hard) RLIMIT_NOFILE,
    as a system with a low open-file limit would. ``run_prefix`` goes before the command (``ip
    netns exec NS``: a broker on a test host of its own, txbroker/chaos/netns.py)."""

    def __init__(
        self,
        data_dir: Path,
        *extra: str,
        env: Mapping[str, str] | None = None,
        nofile: tuple[int, int] | None = None,
        run_prefix: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.run_prefix = tuple(run_prefix)
        self.extra = extra
        self.env = dict(env or {})
        self.nofile = nofile
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.http = ""
        self.log_path = data_dir.parent / f"{data_dir.name}.log"

    def start(self) -> BrokerProcess:
        cmd = [
            *self.run_prefix,
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
            *self.extra,  # later flags win: extra may name ports
        ]
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env={**os.environ, **self.env},
                preexec_fn=self._limit_files if self.nofile is not None else None,
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(READY_PREFIX):
            self.stop()
            raise RuntimeError(f"broker did not start: {line!r}; see {self.log_path}")
        self.url, self.http = parse_ready(line)
        return self

    def _limit_files(self) -> None:
        """In the child, before exec (async-signal-safe: one system call)."""
        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, self.nofile)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._close_pipes()

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM and wait (bounded); SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None:
            return None
        terminate(self.proc, timeout_s)
        self._close_pipes()
        return self.proc.returncode

    def _close_pipes(self) -> None:
        assert self.proc is not None
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
