"""The client commands as a user runs them, against a real broker process."""

from __future__ import annotations

import base64
import json
import subprocess

from tests.conftest import BrokerProcess, run_cli


def _cli(
    *args: str, stdin: str | None = None, env_server: str | None = None
) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, stdin=stdin, env={"TXB_SERVER": env_server} if env_server else None)


def _lines(out: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_topic_send_consume_round_trip(broker: BrokerProcess) -> None:
    s = ["--server", broker.url]
    assert _cli("topic", "create", "cli", "--queues", "2", *s).returncode == 0
    listed = _lines(_cli("topic", "list", "--json", *s))
    assert [(t["topic"], t["queues"], t["messages"]) for t in listed] == [("cli", 2, 0)]
    receipts = _lines(_cli("send", "cli", "--key", "k1", "--json", *s, stdin="one\ntwo\nthree\n"))
    assert [r["offset"] for r in receipts] == [0, 1, 2] and len({r["queue"] for r in receipts}) == 1
    got = _lines(
        _cli("consume", "cli", "--group", "g", "--max", "2", "--json", "--timeout", "2", *s)
    )
    assert [m["body"] for m in got] == ["one", "two"] and got[0]["key"] == "k1"
    # The next run of the same group continues after what was printed and acknowledged.
    rest = _lines(
        _cli("consume", "cli", "--group", "g", "--json", "--timeout", "1", env_server=broker.url)
    )
    assert [m["body"] for m in rest] == ["three"]
    assert _cli("topic", "delete", "cli", *s).returncode == 0
    assert _lines(_cli("topic", "list", "--json", *s)) == []


def test_idempotent_send_prints_the_original_receipt(broker: BrokerProcess) -> None:
    s = ["--server", broker.url]
    _cli("topic", "create", "idem", *s)
    a = _lines(_cli("send", "idem", "--body", "x", "--idempotency-key", "once", "--json", *s))
    b = _lines(_cli("send", "idem", "--body", "x", "--idempotency-key", "once", "--json", *s))
    assert b[0]["duplicate"] is True and b[0]["message_id"] == a[0]["message_id"]


def test_binary_bodies_are_base64_with_a_marker(broker: BrokerProcess) -> None:
    import asyncio

    from txbroker_sdk import Client

    async def send_binary() -> None:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("bin", queues=1)
            await c.send("bin", b"\xff\xfe\x00")

    asyncio.run(send_binary())
    got = _lines(
        _cli("consume", "bin", "--group", "g", "--json", "--timeout", "1", "--server", broker.url)
    )
    assert (
        got[0]["encoding"] == "base64" and base64.b64decode(str(got[0]["body"])) == b"\xff\xfe\x00"
    )


def test_errors_are_clear_and_exit_non_zero(broker: BrokerProcess) -> None:
    out = _cli("send", "nope", "--body", "x", "--server", broker.url)
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr and "create it first" in out.stderr
    out = _cli("topic", "list", "--server", "txb://127.0.0.1:1")
    assert out.returncode == 2 and "cannot connect" in out.stderr
    out = _cli("topic", "list", "--server", "http://x")
    assert out.returncode == 2 and "txb://host:port" in out.stderr
    out = _cli("dlq", "list", "--group", "nobody", "--server", broker.url)
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr
