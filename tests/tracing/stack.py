"""The processes of the end-to-end tracing tests: a broker (`txbroker serve`) and examples/shop's
orders and billing services (uvicorn), each a child process with its own environment, so each
one's OTEL_* variables decide its own tracing. Every start is bounded; ``stop`` ends them all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Self

from tests.conftest import free_port
from tests.serviceproc import ServiceProcess
from txbroker.runtime.brokerproc import BrokerProcess

__all__ = ["SECRET", "Stack"]

SECRET = "trace-secret"
GROUP = "orders-svc"  # examples/shop/orders.py's producer group


def _clean_env() -> dict[str, str]:
    """This process's environment without OTEL_*: each child gets only the ones it is given."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


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
        self.orders: ServiceProcess | None = None
        self.billing: ServiceProcess | None = None

    def start(self) -> Self:
        # BrokerProcess adds os.environ to env: without OTEL_* there, env decides alone.
        saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OTEL_")}
        try:
            self.broker.start()
        finally:
            os.environ.update(saved)
        common = {**_clean_env(), "TXB_SERVER": self.broker.url, "TXB_CHECK_SECRET": SECRET}
        orders_env, billing_env = self._envs
        billing = ServiceProcess(
            "examples.shop.billing:app",
            {**common, "BILLING_DB": f"sqlite:///{self.root / 'billing.db'}", **billing_env},
            self.root / "billing.log",
            name="billing",
        )
        self.billing = billing.start()
        port = free_port()
        orders = ServiceProcess(
            "examples.shop.orders:app",
            {
                **common,
                "ORDERS_DB": f"sqlite:///{self.root / 'orders.db'}",
                "ORDERS_URL": f"http://127.0.0.1:{port}",
                **orders_env,
            },
            self.root / "orders.log",
            name="orders",
            port=port,
        )
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
