"""tests/http/consume.sh: a service with nothing but curl and jq publishes, receives, acks and
nacks over the HTTP API, against a live broker with a token."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, BrokerProcess
from txbroker_sdk import Client

SCRIPT = ROOT / "tests" / "http" / "consume.sh"
TOKEN = "shell-test-token"


@pytest.mark.skipif(
    shutil.which("curl") is None or shutil.which("jq") is None,
    reason="curl and jq are installed by make test (the Makefile's DEBS)",
)
def test_curl_and_jq_publish_receive_ack_and_nack(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "broker", "--auth-token", TOKEN).start()
    try:

        async def topic() -> None:
            async with await Client.connect(b.url, auth_token=TOKEN) as c:
                await c.create_topic("shell-orders", queues=2)

        asyncio.run(topic())
        env = {**os.environ, "TXB": b.http, "TXB_TOKEN": TOKEN, "TOPIC": "shell-orders"}
        out = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (out.stdout, out.stderr)
        assert out.stdout.split("\n") == [
            "published 4",
            "received 4",
            "acked 3",
            "nacked 1",
            "redelivered and acked 1",
            "done",
            "",
        ], out.stdout
    finally:
        assert b.stop() == 0
