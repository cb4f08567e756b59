"""`txbroker group list|describe` and `txbroker topic describe`, against a real broker process:
the lag per queue is the broker's (the same figures as its HTTP admin API)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from typing import Any

import httpx

from tests.conftest import BrokerProcess, run_cli
from txbroker_sdk import Client, Consumer


def _cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, "--server", broker.url, timeout=60)


def _json(out: subprocess.CompletedProcess[str]) -> Any:
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _json_lines(out: subprocess.CompletedProcess[str]) -> list[Any]:
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def _setup(broker: BrokerProcess) -> None:
    """Topic `orders` (3 queues): 4 messages keyed a (one queue), 1 keyed b; group `billing`
    consumed and acknowledged 2 of them."""
    assert _cli(broker, "topic", "create", "orders", "--queues", "3").returncode == 0
    sent = run_cli("send", "orders", "--key", "a", "--server", broker.url, stdin="1\n2\n3\n4\n")
    assert sent.returncode == 0, sent.stderr
    assert _cli(broker, "send", "orders", "--key", "b", "--body", "5").returncode == 0
    got = _cli(broker, "consume", "orders", "--group", "billing", "--max", "2", "--timeout", "2")
    assert got.returncode == 0 and len(got.stdout.splitlines()) == 2, got.stderr


def test_group_lag_per_queue_matches_the_topic_and_the_http_api(broker: BrokerProcess) -> None:
    _setup(broker)
    [listed] = _json_lines(_cli(broker, "group", "list", "--json"))
    assert (listed["group"], listed["topic"], listed["lag"]) == ("billing", "orders", 3)
    described = _json(_cli(broker, "group", "describe", "billing", "--json"))
    assert described["lag"] == 3 and [t["topic"] for t in described["topics"]] == ["orders"]
    queues = described["topics"][0]["queues"]
    topic = _json(_cli(broker, "topic", "describe", "orders", "--json"))
    assert topic["messages"] == 5 and len(topic["offsets"]) == 3
    for q, o in zip(queues, topic["offsets"], strict=True):
        assert q["queue"] == o["queue"] and q["max_offset"] == o["max_offset"]
        committed = q["committed"] if q["committed"] is not None else o["min_offset"]
        assert q["lag"] == o["max_offset"] - committed
    assert sum(q["lag"] for q in queues) == 3
    # topic describe names the groups reading it, with the same lag.
    assert [(g["group"], g["lag"]) for g in topic["groups"]] == [("billing", 3)]
    # The HTTP admin API reports the same figures (one computation in the broker).
    http = httpx.get(f"{broker.http}/v1/groups").json()["groups"]
    assert [(g["group"], g["total_lag"]) for g in http] == [("billing", 3)]
    assert {int(k): v for k, v in http[0]["lag"].items()} == {q["queue"]: q["lag"] for q in queues}


def test_tables_for_people(broker: BrokerProcess) -> None:
    _setup(broker)
    out = _cli(broker, "group", "list")
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split() == ["GROUP", "TOPIC", "MEMBERS", "LAG", "MSGS/S", "LAG", "PER", "QUEUE"]
    assert row.split()[:4] == ["billing", "orders", "0", "3"]
    out = _cli(broker, "group", "describe", "billing")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "billing on orders (lag 3; members: none live)" in lines
    i = lines.index("billing on orders (lag 3; members: none live)")
    assert lines[i + 1].split() == ["QUEUE", "MAX", "OFFSET", "COMMITTED", "LAG"]
    assert len(lines[i + 2 : i + 5]) == 3  # one row per queue
    out = _cli(broker, "topic", "describe", "orders")
    assert out.returncode == 0, out.stderr
    assert "MIN OFFSET" in out.stdout and "billing" in out.stdout
    # Columns line up: every row of the queue table is as long as its header.
    lines = out.stdout.splitlines()
    start = lines.index("queues") + 1
    widths = {len(line) for line in lines[start : start + 4]}
    assert len(widths) == 1, lines[start : start + 4]


async def test_a_live_member_shows_before_its_first_commit(broker: BrokerProcess) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("live", queues=2)
        await c.send("live", b"x")
        async with Consumer(c, "watchers", "live") as consumer:
            await consumer.fetch(timeout_ms=2000)  # joined; nothing acknowledged yet
            out = await asyncio.to_thread(_cli, broker, "group", "describe", "watchers", "--json")
            described = _json(out)
            [t] = described["topics"]
            assert t["members"] == [consumer.member_id] and t["lag"] == 1
            lines = _json_lines(
                await asyncio.to_thread(_cli, broker, "group", "list", "--topic", "live", "--json")
            )
            assert [g["group"] for g in lines] == ["watchers"]


def test_unknown_names_are_clear_errors(broker: BrokerProcess) -> None:
    out = _cli(broker, "group", "describe", "nobody")
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr and "nobody" in out.stderr
    out = _cli(broker, "topic", "describe", "nope")
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr
    out = _cli(broker, "group", "list", "--topic", "nope")
    assert out.returncode == 2 and "NOT_FOUND" in out.stderr
    out = _cli(broker, "group", "list")
    assert out.returncode == 0 and out.stdout == "" and "no consumer groups" in out.stderr


async def test_rates_once_the_broker_has_watched_for_a_few_seconds(
    broker: BrokerProcess,
) -> None:
    async with await Client.connect(broker.url) as c:
        await c.create_topic("rated", queues=1)
        describe = ("topic", "describe", "rated", "--json")
        first = _json(await asyncio.to_thread(_cli, broker, *describe))
        assert first["rate_per_s"] is None  # not watched long enough yet
        deadline = asyncio.get_running_loop().time() + 20
        while True:  # one message every 100 ms, until the broker reports a rate (bounded)
            await c.send("rated", b"x")
            async with Consumer(c, "raters", "rated") as consumer:
                for m in await consumer.fetch(timeout_ms=1000):
                    m.ack()
            topic = _json(await asyncio.to_thread(_cli, broker, *describe))
            [group] = topic["groups"] or [{"rate_per_s": None}]
            if topic["rate_per_s"] and group["rate_per_s"]:
                break
            assert asyncio.get_running_loop().time() < deadline, topic
            await asyncio.sleep(0.1)  # pacing the sends, not synchronisation
    assert 0 < topic["rate_per_s"] < 100 and 0 < group["rate_per_s"] < 100
    out = await asyncio.to_thread(_cli, broker, "topic", "describe", "rated")
    assert "msgs/s over the last minute" in out.stdout
