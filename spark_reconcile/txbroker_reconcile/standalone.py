"""A Spark standalone cluster from the installed pyspark: one master and one worker on loopback,
for tests and for trying the job on a cluster on one machine (docs/reconciliation.md).

    python -m txbroker_reconcile.standalone --port 7077

starts one on 127.0.0.1, prints the master URL to give ``--master``, and stops it (executors
included) on Ctrl-C or SIGTERM. From Python, :class:`StandaloneCluster`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from txbroker_reconcile.errors import CannotRun

__all__ = ["MASTER_CLASS", "WORKER_CLASS", "StandaloneCluster", "main", "spark_home"]

MASTER_CLASS: Final = "org.apache.spark.deploy.master.Master"
WORKER_CLASS: Final = "org.apache.spark.deploy.worker.Worker"
LOOPBACK: Final = "127.0.0.1"
# Both daemons up and the worker registered: 6-10 s measured on a 2-core machine; a slow CI
# runner is given six times that.
READY_TIMEOUT_S: Final = 60.0
# A daemon's shutdown hook stops its executors within a few seconds; beyond this its whole
# process group is killed.
STOP_TIMEOUT_S: Final = 15.0
POLL_S: Final = 0.25
# Heap of each daemon JVM (SPARK_DAEMON_MEMORY; Spark's default is 1g). They only schedule and
# launch executors, whose memory is the worker's --memory.
DAEMON_MEMORY: Final = "512m"
_DAEMONS: Final = ("master", "worker")


def spark_home() -> Path:
    """The installed pyspark's folder, which is a Spark home (``bin/spark-class``, ``jars/``)."""
    try:
        import pyspark
    except ImportError as e:
        raise CannotRun(f"pyspark is not installed: pip install 'txbroker[reconcile]' ({e})") from e
    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise CannotRun(f"{home} has no bin/spark-class: pyspark's installation is incomplete")
    return home


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class StandaloneCluster:
    """One master and one worker on 127.0.0.1 (RPC, web UIs and executors: nothing listens
    beyond loopback), their files (logs, the worker's work and scratch directories) under
    ``directory``, a new temporary directory by default (removed by a clean :meth:`stop`,
    kept when the start failed so its logs can be read). Ports left at 0 are chosen free.
    Executors run ``python`` (default: this interpreter), so they import the same
    txbroker_reconcile.

    ::

        with StandaloneCluster() as cluster:
            subprocess.run(["txbroker", "reconcile", "--master", cluster.master_url, ...])

    The pip package ships ``bin/spark-class`` but not ``sbin/``'s start scripts, so the two daemons
    are started as ``spark-class org.apache.spark.deploy.master.Master`` and ``… worker.Worker`` in
    the foreground, each a child process in a session of its own with its log in the cluster's
    directory. The master's web UI answers ``/json/`` with its state and workers: the cluster is
    ready when it says ALIVE with one alive worker.
    """

    def __init__(
        self,
        directory: Path | None = None,
        *,
        port: int = 0,
        ui_port: int = 0,
        cores: int = 1,
        memory: str = "1g",
        python: str = sys.executable,
    ) -> None:
        self._own_dir = directory is None
        self.dir = directory or Path(tempfile.mkdtemp(prefix="txbroker-spark-"))
        self.host = LOOPBACK
        self.port = port or _free_port(self.host)
        self.ui_port = ui_port or _free_port(self.host)
        self.worker_ui_port = _free_port(self.host)
        self.cores = cores
        self.memory = memory
        self.python = python
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        # the daemons' process groups and sessions (each its own leader), kept after they end
        self._groups: set[int] = set()
        self._failed = False

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def log_path(self, daemon: str) -> Path:
        return self.dir / f"{daemon}.log"

    def commands(self) -> dict[str, list[str]]:
        """The master's and the worker's command lines, as one would type them."""
        spark_class = str(spark_home() / "bin" / "spark-class")
        master = [spark_class, MASTER_CLASS, "--host", self.host, "--port", str(self.port),
                  "--webui-port", str(self.ui_port)]  # fmt: skip
        worker = [spark_class, WORKER_CLASS, "--host", self.host, "--port", "0",
                  "--webui-port", str(self.worker_ui_port), "--cores", str(self.cores),
                  "--memory", self.memory, "--work-dir", str(self.dir / "work"),
                  self.master_url]  # fmt: skip
        return {"master": master, "worker": worker}

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            # Binds the daemons' web UIs (0.0.0.0 otherwise) and the executors to loopback.
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOCAL_DIRS": str(self.dir / "local"),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            # A port taken meanwhile fails the start (naming the log) instead of Spark moving
            # to the next port, where nothing would look for the master or its web UI.
            "SPARK_DAEMON_JAVA_OPTS": " ".join(
                (os.environ.get("SPARK_DAEMON_JAVA_OPTS", ""), "-Dspark.port.maxRetries=0")
            ).strip(),
            "PYSPARK_PYTHON": self.python,
        }

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> StandaloneCluster:
        """Start both daemons and wait until the worker has registered; on failure stop what
        was started and raise :class:`CannotRun` naming the log of the daemon at fault."""
        for sub in ("work", "local"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        env = self.env()
        try:
            for name, cmd in self.commands().items():
                with open(self.log_path(name), "wb") as log:
                    # A session of its own: the executors the worker launches join its process
                    # group, so stopping the group leaves nothing behind.
                    self._procs[name] = subprocess.Popen(
                        cmd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=env,
                        cwd=self.dir,
                        start_new_session=True,
                    )
                    self._groups.add(self._procs[name].pid)
            self._wait_ready(timeout_s)
        except BaseException:
            self._failed = True
            self.stop()
            raise
        return self

    def status(self) -> dict[str, Any] | None:
        """The master's state (its web UI's ``/json/``), or None while it does not answer."""
        try:
            with urllib.request.urlopen(self.ui_url + "/json/", timeout=2) as r:
                doc: dict[str, Any] = json.load(r)
                return doc
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise CannotRun(
                        f"the Spark {name} exited with {proc.returncode}; its log, "
                        f"{self.log_path(name)}, ends:\n{self.log_tail(name)}"
                    )
            doc = self.status()
            if doc is not None and doc.get("status") == "ALIVE" and doc.get("aliveworkers"):
                return
            if time.monotonic() > deadline:
                # Not answering at all: the master is at fault; else the worker never registered.
                name = "master" if doc is None else "worker"
                raise CannotRun(
                    f"the Spark {name} was not ready within {timeout_s:g}s; see its log, "
                    f"{self.log_path(name)}, which ends:\n{self.log_tail(name)}"
                )
            time.sleep(POLL_S)  # polling the master's state: the condition awaited

    def log_tail(self, daemon: str, lines: int = 20) -> str:
        path = self.log_path(daemon)
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def pids(self) -> list[int]:
        """The live processes of the daemons' sessions, from /proc: executors and their Python
        workers included (PySpark's daemon moves to a process group of its own, but stays in
        the session). Empty once stopped."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            # pid (comm) state ppid pgrp session …; comm may hold spaces and parentheses
            state, _ppid, _pgrp, session = stat.rpartition(")")[2].split()[:4]
            if int(session) in self._groups and state != "Z":
                found.append(int(entry.name))
        return found

    def stop(self) -> None:
        """Stop the worker (its executors with it), then the master: SIGTERM to each one's
        process group, SIGKILL to whatever outlives ``STOP_TIMEOUT_S`` or the daemon itself.
        Idempotent. Removes the temporary directory, unless the start failed."""
        for name in reversed(_DAEMONS):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(STOP_TIMEOUT_S)
            # Executors or Python workers left in the group once the daemon is gone.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        # Whatever left the groups but not the sessions (PySpark's daemons), until none is left.
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while left := self.pids():
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CannotRun(f"Spark processes {left} outlived SIGKILL for {STOP_TIMEOUT_S:g}s")
            time.sleep(POLL_S / 5)  # the kernel tearing them down: the condition awaited
        if self._own_dir and not self._failed:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m txbroker_reconcile.standalone",
        description="Run a Spark standalone master and worker on 127.0.0.1 from the installed "
        "pyspark until Ctrl-C or SIGTERM.",
    )
    p.add_argument(
        "--dir", help="logs, the worker's work and scratch space (default: a temporary one)"
    )
    p.add_argument("--port", type=int, default=0, help="the master's port (default: a free one)")
    p.add_argument("--ui-port", type=int, default=0, help="its web UI's (default: a free one)")
    p.add_argument("--cores", type=int, default=1, help="the worker's cores (default 1)")
    p.add_argument("--memory", default="1g", help="the worker's memory for executors (1g)")
    args = p.parse_args(argv)
    cluster = StandaloneCluster(
        Path(args.dir) if args.dir else None, port=args.port, ui_port=args.ui_port,
        cores=args.cores, memory=args.memory,
    )  # fmt: skip
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start()
    except CannotRun as e:
        print(f"cannot start: {e}", file=sys.stderr)
        return 2
    try:
        print(f"master {cluster.master_url} · web UI {cluster.ui_url} · logs in {cluster.dir}")
        print(f"submit with: txbroker reconcile --master {cluster.master_url} …", flush=True)
        stop.wait()
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
