"""Fixtures for transactions: a broker with fast check timings and a real check-back server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.conftest import BrokerProcess
from tests.httpserver import serve_app
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus

SECRET = "s3cret"
GROUP = "orders-svc"
FAST = """
tx_timeout_ms = 300
check_backoff_base_ms = 100
check_backoff_cap_ms = 200
max_checks = 3
check_timeout_ms = 500
"""


def tx_broker(path: Path, *extra: str, settings: str = FAST) -> BrokerProcess:
    cfg = path.parent / f"{path.name}.toml"
    cfg.write_text(settings)
    return BrokerProcess(path, "--config", str(cfg), "--tx-secret", f"{GROUP}={SECRET}", *extra)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = tx_broker(tmp_path / "broker").start()
    yield b
    b.stop()


@dataclass
class CheckServer:
    """A service's check-back endpoint whose answers the test sets per transaction."""

    url: str = ""
    answers: dict[str, CheckStatus] = field(default_factory=dict)
    default: CheckStatus = CheckStatus.UNKNOWN
    seen: list[CheckRequest] = field(default_factory=list)
    traceparents: list[str | None] = field(default_factory=list)

    def resolve(self, check: CheckRequest) -> CheckStatus:
        self.seen.append(check)
        return self.answers.get(check.tx_id, self.default)

    def checks_for(self, tx_id: str) -> int:
        return sum(1 for c in self.seen if c.tx_id == tx_id)


@pytest.fixture
async def checks() -> AsyncIterator[CheckServer]:
    async with check_server() as server:
        yield server


@contextlib.asynccontextmanager
async def check_server() -> AsyncIterator[CheckServer]:
    """A check-back endpoint on a free loopback port, for as long as the block runs."""
    server = CheckServer()
    endpoint = CheckbackEndpoint(server.resolve, {GROUP: SECRET})

    class Recording:  # an ASGI app (a class instance, so Starlette passes scope/receive/send)
        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            tp = dict(scope.get("headers", [])).get(b"traceparent")
            server.traceparents.append(tp.decode() if tp else None)
            await endpoint(scope, receive, send)

    app = Starlette(routes=[Route("/txb/check", Recording(), methods=["POST"])])
    async with serve_app(app) as base:
        server.url = base + "/txb/check"
        yield server
