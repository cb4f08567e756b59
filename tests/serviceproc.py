"""A web service as a child process, ``uvicorn <module>:app`` on a port of its own, as the
end-to-end tests run the example services and their own test apps: each start waited for
(bounded), its log kept, each stop a SIGTERM (a SIGKILL if it hangs)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Self

from tests.conftest import ROOT, free_port
from txbroker.runtime.brokerproc import terminate

__all__ = ["STARTED", "ServiceProcess"]

# uvicorn's line once its socket listens. Its "Application startup complete" comes before it
# binds the port (the lifespan starts first): a request sent on that line may be refused.
STARTED = "Uvicorn running on"
# A service starts in a second or two; a loaded 2-core machine running the suite takes longer.
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class ServiceProcess:
    """``uvicorn APP`` on 127.0.0.1 with ``env`` as its whole environment (and what
    :meth:`start` adds). Its stderr is read to the end by a thread (a full pipe would block the
    service): :meth:`log` is this run's, ``log_path`` keeps every run's."""

    def __init__(
        self,
        app: str,
        env: dict[str, str],
        log_path: Path,
        *,
        name: str | None = None,
        port: int | None = None,
    ) -> None:
        self.app = app
        self.name = name or app
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, **extra_env: str) -> Self:
        """Start it and return once its app started and its port takes connections;
        AssertionError with its log if it exits or does not get there in time."""
        self.lines = []
        cmd = [sys.executable, "-m", "uvicorn", self.app]
        self.proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env={**self.env, **extra_env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        started_or_ended = threading.Event()
        self._reader = threading.Thread(
            target=self._read, args=(self.proc, self.lines, started_or_ended), daemon=True
        )
        self._reader.start()
        started_or_ended.wait(START_TIMEOUT_S)
        if not any(STARTED in line for line in self.lines):
            self.stop()
            raise AssertionError(f"{self.name} did not start:\n{self.log()}")
        return self

    def _read(
        self, proc: subprocess.Popen[str], lines: list[str], started_or_ended: threading.Event
    ) -> None:
        assert proc.stderr is not None
        with open(self.log_path, "a") as log:
            for line in proc.stderr:
                lines.append(line)  # this run's list: a restart's lines go to a new one
                log.write(line)
                log.flush()
                if STARTED in line:
                    started_or_ended.set()
        started_or_ended.set()

    def log(self) -> str:
        """What this run wrote to stderr so far: all of it once it has exited."""
        if self.proc is not None and self.proc.poll() is not None and self._reader is not None:
            self._reader.join(STOP_TIMEOUT_S)  # its last lines may still be in the pipe
        return "".join(self.lines)

    def stop(self) -> int | None:
        """SIGTERM and wait (bounded); SIGKILL if it hangs. Its exit code (None: never
        started)."""
        if self.proc is None:
            return None
        terminate(self.proc, STOP_TIMEOUT_S)
        return self.proc.returncode
