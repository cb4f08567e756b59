"""`txbroker tx` for operators, and the `serve` flags that make parking reachable in seconds:
a broker started with them parks a transaction whose service keeps answering UNKNOWN, and
`tx list`/`tx show` say so in words and local times."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import BrokerProcess, run_cli
from tests.httpserver import serve_app
from txbroker.cli import build_parser
from txbroker.cli.serve import config_from_args
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus

GROUP, SECRET = "cli", "cli-secret"
FAST = (
    "--tx-timeout-ms", "200",
    "--check-backoff-base-ms", "100",
    "--check-backoff-cap-ms", "200",
    "--max-checks", "2",
    "--check-timeout-ms", "1000",
)  # fmt: skip


def test_serve_flags_reach_the_settings(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("max_checks = 9\ncheck_backoff_cap_ms = 9000\n")
    args = build_parser().parse_args(["serve", *FAST, "--config", str(cfg)])
    config = config_from_args(args, {"TXB_MAX_CHECKS": "7", "TXB_CHECK_BACKOFF_CAP_MS": "8000"})
    assert (config.tx_timeout_ms, config.check_backoff_base_ms) == (200, 100)
    assert (config.check_backoff_cap_ms, config.max_checks, config.check_timeout_ms) == (
        200,
        2,
        1000,
    )  # flags win over the environment and the file
    bare = config_from_args(build_parser().parse_args(["serve", "--config", str(cfg)]), {})
    assert (bare.max_checks, bare.check_backoff_cap_ms, bare.tx_timeout_ms) == (9, 9000, 6000)


def test_bad_flag_values_are_refused() -> None:
    out = run_cli("serve", "--max-checks", "0")
    assert out.returncode == 2 and "must be positive" in out.stderr


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker", *FAST, "--tx-secret", f"{GROUP}={SECRET}").start()
    yield b
    b.stop()


@pytest.fixture
async def check_url() -> AsyncIterator[str]:
    """A service's check-back endpoint that never knows the answer."""

    async def unknown(_: CheckRequest) -> CheckStatus:
        return CheckStatus.UNKNOWN

    endpoint = CheckbackEndpoint(unknown, {GROUP: SECRET})
    app = Starlette(routes=[Route("/txb/check", endpoint, methods=["POST"])])
    async with serve_app(app) as base:
        yield base + "/txb/check"


async def _cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    # In a thread: the check-back endpoint is served by this test's event loop meanwhile.
    return await asyncio.to_thread(run_cli, *args, "--server", broker.url, timeout=60)


async def _prepare(broker: BrokerProcess, check_url: str, *extra: str) -> str:
    out = await _cli(
        broker, "tx", "prepare", "orders", "--check-url", check_url, "--group", GROUP, *extra
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


async def test_parking_in_seconds_and_states_in_words(
    broker: BrokerProcess, check_url: str
) -> None:
    assert (await _cli(broker, "topic", "create", "orders")).returncode == 0
    parked = await _prepare(broker, check_url)
    pending = await _prepare(broker, check_url, "--timeout-ms", "600000")
    deadline = time.monotonic() + 30
    while True:  # polling the broker's state: the condition under test
        shown = json.loads((await _cli(broker, "tx", "show", parked, "--json")).stdout)
        if shown["state"] == "parked":
            break
        assert time.monotonic() < deadline, shown
        await asyncio.sleep(0.1)
    assert shown["checks"] == 2 and "parked after 2 checks" in shown["reason"]

    out = await _cli(broker, "tx", "list", "--state", "parked")
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:3] == ["TX", "ID", "STATE"]
    assert [r.split()[:2] for r in rows] == [[parked, "parked"]]
    assert "1 of 1 parked transactions shown" in out.stderr

    out = await _cli(broker, "tx", "list", "--state", "pending")
    [row] = out.stdout.splitlines()[1:]
    assert row.split()[:3] == [pending, "pending", "orders"]
    # Created: local time and how long ago; the next check: how soon.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\S* \((now|\d+ s ago)\)", row), row
    assert "in 10 min" in row
    assert "1 of 1 pending transactions shown" in out.stderr
    listed = [
        json.loads(x) for x in (await _cli(broker, "tx", "list", "--json")).stdout.splitlines()
    ]
    assert {t["tx_id"]: t["state"] for t in listed} == {parked: "parked", pending: "prepared"}

    out = await _cli(broker, "tx", "show", pending)
    fields = dict(line.strip().split("  ", 1) for line in out.stdout.splitlines())
    assert fields["state"].strip() == "pending"
    assert re.search(r"\((now|\d+ s ago)\)$", fields["created"]), fields
    assert fields["next check"].strip().endswith("(in 10 min)"), fields
    out = await _cli(broker, "tx", "show", parked)
    assert "parked after 2 checks" in out.stdout

    out = await _cli(broker, "tx", "rollback", parked)
    assert out.returncode == 0 and out.stdout.strip() == f"{parked} is rolled_back"
    out = await _cli(broker, "tx", "list", "--state", "parked")
    assert out.stdout == "" and "no parked transactions" in out.stderr
