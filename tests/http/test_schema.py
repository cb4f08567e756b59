"""schemathesis against a live broker's ``/v1/openapi.json``: no 5xx, and every answer matches
the document (status, content type, headers, body); invalid input is refused. Configured by
tests/http/schemathesis.toml. The run's case count is printed."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from tests.conftest import ROOT, BrokerProcess
from txbroker.server.http.openapi import openapi_document
from txbroker_sdk import Client

CONFIG = ROOT / "tests" / "http" / "schemathesis.toml"
TOKEN = "schema-test-token"
ST = Path(sys.executable).parent / "st"


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    b = BrokerProcess(
        tmp_path / "broker", "--auth-token", TOKEN, "--tx-secret", "orders-svc=schema-secret"
    ).start()

    async def topic() -> None:
        async with await Client.connect(b.url, auth_token=TOKEN) as c:
            await c.create_topic("orders", queues=2)

    try:
        asyncio.run(topic())
        yield b
    finally:
        assert b.stop() == 0
    log = b.log_path.read_text()
    assert "Traceback" not in log, log[-4000:]


@pytest.mark.timeout(300)
def test_every_answer_matches_the_document(
    broker: BrokerProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = subprocess.run(
        [str(ST), "--config-file", str(CONFIG), "run", f"{broker.http}/v1/openapi.json"],
        env={**os.environ, "TXB_TOKEN": TOKEN, "NO_COLOR": "1"},
        cwd=tmp_path,  # its cache of failures (.schemathesis/) goes there, not in the tree
        capture_output=True,
        text=True,
        timeout=280,
    )
    summary = re.search(r"Test cases:\s*\n\s*(\d+) generated, (.*)", out.stdout)
    with capsys.disabled():
        print(f"\nschemathesis: {summary.group(0).split(chr(10))[-1].strip() if summary else '?'}")
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
    assert summary is not None and int(summary.group(1)) > 0, out.stdout[-2000:]
    assert "passed" in summary.group(2) and "fail" not in summary.group(2), summary.group(0)


def test_a_receive_with_messages_matches_the_document(broker: BrokerProcess) -> None:
    """What schemathesis does not reach (its receives name topics that do not exist): a
    receive's and an ack's answers, with messages, against their schemas."""
    doc = openapi_document()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=broker.http, headers=auth, timeout=30) as h:
        for body in (
            {"body": "text", "key": "k", "headers": {"a": "b"}},
            {"body": "/w==", "encoding": "base64", "tags": "t"},
        ):
            assert h.post("/v1/topics/orders/messages", json=body).status_code == 201
        base = "/v1/groups/schema-g/topics/orders"
        r = h.post(f"{base}/receive", json={"max": 10, "wait_ms": 2000, "invisible_ms": 1000})
        assert r.status_code == 200 and len(r.json()["messages"]) >= 1
        _validate(doc, r.json(), "ReceivedMessages")
        receipts = [m["receipt"] for m in r.json()["messages"]]
        for action, extra in (("extend", {"invisible_ms": 5000}), ("ack", {}), ("nack", {})):
            a = h.post(f"{base}/{action}", json={"receipts": receipts, **extra})
            assert a.status_code == 200
            _validate(doc, a.json(), "Settled")


def _validate(doc: dict[str, Any], instance: object, name: str) -> None:
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    jsonschema_rs.Draft202012Validator(schema).validate(instance)
