"""The processes of the end-to-end tracing tests: a broker (`txbroker serve`) and examples/shop's
orders and billing services (uvicorn), each a child process with its own environment, so each
one's OTEL_* variables decide its own tracing. Every start is bounded; ``stop`` ends them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Self

from tests.conftest import ROOT, free_port
from txbroker.runtime.brokerproc import BrokerProcess

__all__ = ["SECRET", "Stack"]

SECRET = "trace-secret"
GROUP = "orders-svc"  # examples/shop/orders.py's producer group
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
READY = "Application startup complete"


def _clean_env() -> dict[str, str]:
    """This process's environment without OTEL_*: each child gets only the ones it is given."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


class Service:
    """``uvicorn examples.shop.<name>:app``; its stderr goes to a file, read for the ready line."""

    def __init__(self, name: str, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []

    def start(self) -> Self:
        cmd = [sys.executable, "-m", "uvicorn", f"examples.shop.{self.name}:app"]
        self.proc = subprocess.Popen(
            [*cmd, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env={**_clean_env(), **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready = threading.Event()
        threading.Thread(target=self._read, args=(self.proc, ready), daemon=True).start()
        ready.wait(START_TIMEOUT_S)
        if not any(READY in line for line in self.lines):
            self.stop()
            raise AssertionError(f"{self.name} did not start:\n{self.log()}")
        return self

    def _read(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stderr is not None
        with open(self.log_path, "a") as log:
            for line in proc.stderr:  # to the end: a full pipe would block the service
                self.lines.append(line)
                log.write(line)
                log.flush()
                if READY in line:
                    ready.set()
        ready.set()

    def log(self) -> str:
        return "".join(self.lines[-40:])

    def stop(self) -> int | None:
        """SIGTERM (the lifespan flushes the spans) and wait, bounded; SIGKILL if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        return self.proc.returncode


class Stack:
    """A broker whose back-checks come one second after a PREPARE left open, and the shop's
    orders (publisher, check-back endpoint, outbox relay) and billing (subscriber) services on
    SQLite files. ``*_env`` are each process's OTEL_* (and other) variables."""

    def __init__(
        self,
        root: Path,
        broker_env: dict[str, str],
        orders_env: dict[str, str],
        billing_env: dict[str, str],
    ) -> None:
        self.root = root
        self.broker = BrokerProcess(
            root / "broker",
            "--segment-mib",
            "8",
            "--tx-secret",
            f"{GROUP}={SECRET}",
            "--tx-timeout-ms",
            "1000",
            "--check-backoff-base-ms",
            "200",
            "--check-backoff-cap-ms",
            "500",
            env={**_clean_env(), "TXB_INDEX_CAPACITY": "65536", **broker_env},
        )
        self._envs = (orders_env, billing_env)
        self.orders: Service | None = None
        self.billing: Service | None = None

    def start(self) -> Self:
        # BrokerProcess adds os.environ to env: without OTEL_* there, env decides alone.
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OTEL_")}
        try:
            self.broker.start()
        finally:
            os.environ.update(saved)
        common = {"TXB_SERVER": self.broker.url, "TXB_CHECK_SECRET": SECRET}
        orders_env, billing_env = self._envs
        billing = Service(
            "billing",
            {**common, "BILLING_DB": f"sqlite:///{self.root / 'billing.db'}", **billing_env},
            self.root / "billing.log",
        )
        self.billing = billing.start()
        orders = Service("orders", {}, self.root / "orders.log")
        orders.env = {
            **common,
            "ORDERS_DB": f"sqlite:///{self.root / 'orders.db'}",
            "ORDERS_URL": orders.url,
            **orders_env,
        }
        self.orders = orders.start()
        return self

    def logs(self) -> str:
        return "\n".join(
            f"{s.name}:\n{s.log()}" for s in (self.orders, self.billing) if s is not None
        )

    def stop(self) -> dict[str, int | None]:
        """Stop the services, then the broker; their exit codes."""
        codes = {s.name: s.stop() for s in (self.orders, self.billing) if s is not None}
        codes["broker"] = self.broker.stop()
        return codes
