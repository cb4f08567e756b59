"""A real etcd process for tests and campaigns: Debian's ``/usr/bin/etcd`` (package
``etcd-server``) on free loopback ports with a data directory of its own, killed with its
parent however that dies.

    etcd = EtcdServer(root / "etcd").start()  # waits until it answers
    ... connect_coordinator(etcd.url) ...
    etcd.kill()
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = ["ETCD_BIN", "EtcdServer", "free_port"]

ETCD_BIN: Final = Path(os.environ.get("TXB_TEST_ETCD", "/usr/bin/etcd"))
# A single-member etcd elects itself after one election timeout (1 s by default) and answers
# within ~1.5 s on an idle machine; 30 s covers a loaded 2-core CI runner many times over.
START_TIMEOUT_S: Final = 30.0
# Stopping takes the kernel microseconds per thread; 10 s is a bound for a machine too loaded to
# schedule the signal's delivery, far past anything a test would wait for.
STOP_TIMEOUT_S: Final = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> list[str]:
    """A prefix that has the kernel SIGKILL etcd when the test process dies, however it dies
    (util-linux's setpriv sets the parent-death signal, then execs: etcd keeps its pid). Not
    a ``preexec_fn``: Python code between fork and exec in a process with gRPC's threads may
    deadlock (gRPC warns of it)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


class EtcdServer:
    """One etcd member on loopback, or on ``host`` (its own address in a test network, with
    ``run_prefix`` to start it there): ``url`` is what ``connect_etcd`` takes."""

    def __init__(
        self, data_dir: Path, host: str = "127.0.0.1", run_prefix: Sequence[str] = ()
    ) -> None:
        self.data_dir = data_dir
        self.host = host
        self.run_prefix = tuple(run_prefix)
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self.client_port = 0
        self.peer_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.client_port}"

    def start(self) -> EtcdServer:
        """Start (or start again, on the same data and ports) and wait until it answers."""
        if not self.client_port:
            self.client_port, self.peer_port = free_port(), free_port()
        client = f"http://{self.host}:{self.client_port}"
        peer = f"http://{self.host}:{self.peer_port}"
        cmd = [
            *self.run_prefix,
            *_die_with_parent(),
            str(ETCD_BIN),
            "--name",
            "txb-test",
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"txb-test={peer}",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        self._wait_healthy(client)
        return self

    def _wait_healthy(self, client: str) -> None:
        """Poll etcd's /health until it says true (it does once it has a leader and serves),
        bounded; an etcd that exits is reported at once with its log's tail."""
        assert self.proc is not None
        end = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}: {self._tail()}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as answer:
                    last = answer.read().decode()
                    if '"health":"true"' in last.replace(" ", ""):
                        return
            except OSError as e:
                last = str(e)
            time.sleep(0.05)  # the poll's period, not a synchronisation
        self.kill()
        raise RuntimeError(f"etcd not healthy within {START_TIMEOUT_S} s ({last}): {self._tail()}")

    def _tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return "(no log)"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def pause(self) -> None:
        """SIGSTOP: the sockets stay open, nothing answers (a hung or partitioned etcd).
        Returns once every thread is stopped: the signal only asks, and on a loaded machine a
        thread may still answer a request sent right after ``kill`` returns."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while not _all_stopped(self.pid):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"etcd (pid {self.pid}) did not stop within {STOP_TIMEOUT_S} s of SIGSTOP"
                )
            time.sleep(0.005)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL (a stopped process dies of it too) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is in the stopped state (``T`` in /proc)."""
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return True  # gone: nothing of it answers
    for thread in threads:
        try:
            stat = (thread / "stat").read_text()
        except FileNotFoundError:
            continue  # that thread has ended
        # The state is the field after the command's closing parenthesis (names hold spaces).
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True
