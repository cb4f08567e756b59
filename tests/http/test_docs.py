"""docs/http-api.md's curl examples, run in order against a live broker with a token: each
answers the status the page shows after it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, BrokerProcess
from txbroker_sdk import Client

DOC = ROOT / "docs" / "http-api.md"
TOKEN = "docs-example-token"
# A ```sh block of one curl command, then the ```http block of its answer's status line.
EXAMPLE = re.compile(r"```sh\n(curl .*?)```\s*```http\nHTTP/1\.1 (\d{3}) ", re.S)
# Prints the final status after the body, where the test finds it.
PRELUDE = "curl() { command curl -w '\\nTXB-STATUS %{http_code}\\n' \"$@\"; }\n"


def examples() -> list[tuple[str, int]]:
    return [(cmd, int(status)) for cmd, status in EXAMPLE.findall(DOC.read_text())]


def test_every_endpoint_has_an_example() -> None:
    text = "".join(cmd for cmd, _ in examples())
    paths = ("/messages", '/v1/transactions"', "/commit", "/rollback", "/v1/openapi.json")
    receiving = ("/receive", "/ack", "/nack", "/extend")
    checks = ("/checks", "/unknown")
    for path in paths + receiving + checks:
        assert path in text, path
    assert text.count("curl ") == len(examples()) >= 10


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_examples_answer_as_documented(tmp_path: Path) -> None:
    b = BrokerProcess(
        tmp_path / "broker", "--auth-token", TOKEN, "--tx-secret", "orders-svc=docs-secret"
    ).start()
    try:

        async def topic() -> None:
            async with await Client.connect(b.url, auth_token=TOKEN) as c:
                await c.create_topic("orders", queues=4)

        asyncio.run(topic())
        env = {**os.environ, "TXB": b.http, "TXB_TOKEN": TOKEN}
        for cmd, status in examples():
            out = subprocess.run(
                ["bash", "-c", PRELUDE + cmd],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, (cmd, out.stderr)
            got = re.findall(r"TXB-STATUS (\d{3})", out.stdout)
            assert got and int(got[-1]) == status, (cmd, out.stdout)
    finally:
        assert b.stop() == 0
