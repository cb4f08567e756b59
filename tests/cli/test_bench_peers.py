"""`txbroker bench peers` at a tiny size, run as a user runs it: real brokers, real output.

The peers are the machine's RabbitMQ (127.0.0.1:5672) and NATS with JetStream (4222). Where one
is absent the bench must skip it with one line and still succeed; where it is present, its
figures and ratios must be printed and nothing the run created may be left on it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from tests.conftest import run_cli

TINY = ("--messages", "300", "--window", "32", "--batch", "8", "--rate", "200")
PEER_KEYS = {"rabbitmq-classic", "rabbitmq-quorum", "nats-file"}
RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
NATS_URL = "nats://127.0.0.1:4222"


def _closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_unreachable_peers_are_skipped_not_failed(tmp_path: Path) -> None:
    port = _closed_port()
    out = run_cli(
        "bench",
        "peers",
        *TINY,
        "--rounds",
        "1",
        "--workloads",
        "single,batch",
        "--rabbitmq-url",
        f"amqp://guest:guest@127.0.0.1:{port}/",
        "--nats-url",
        f"nats://127.0.0.1:{port}",
        "--data-dir",
        str(tmp_path),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    skipped = [line for line in out.stderr.splitlines() if line.startswith("skipped ")]
    assert len(skipped) == 3, out.stderr  # one line each, saying why
    assert all("not reachable" in line for line in skipped), skipped
    res = json.loads(out.stdout)
    status = {s["key"]: s["status"] for s in res["systems"]}
    assert status == {
        "txbroker-sync": "measured",
        "txbroker-async": "measured",
        **dict.fromkeys(PEER_KEYS, "skipped"),
    }
    for workload in ("single", "batch"):
        assert set(res["results"][workload]) == {"txbroker-sync", "txbroker-async"}
        assert res["results"][workload]["txbroker-sync"]["median"]["messages"] == 300
        assert set(res["ratios"][workload]["txbroker-sync"]) == {"txbroker-async"}
    assert list(tmp_path.iterdir()) == []  # the brokers stopped, their directories removed


def test_figures_and_ratios_against_the_local_peers(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "peers",
        *TINY,
        "--rounds",
        "2",  # two rounds: the order rotates, medians over both
        "--e2e-seconds",
        "1",
        "--data-dir",
        str(tmp_path),
        "--json",
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    systems = {s["key"]: s for s in res["systems"]}
    assert systems["txbroker-sync"]["durability"].startswith("fdatasync before ack")
    measured = {k for k, s in systems.items() if s["status"] == "measured"}
    for key in PEER_KEYS - measured:  # absent here: skipped with its reason, not failed
        assert systems[key]["status"] == "skipped", systems[key]
        assert f"skipped {systems[key]['label']}" in out.stderr
    for workload in ("single", "batch", "e2e"):
        for key in measured:
            cell = res["results"][workload][key]
            assert len(cell["rounds"]) == 2
            med = cell["median"]
            if workload == "e2e":
                assert med["received"] == med["sent"] == 200 and med["consumed_rate"] > 0
                assert 0 < med["p50_ms"] <= med["p99_ms"] <= med["max_ms"]
            else:
                assert med["messages"] == 300 and med["msgs_per_s"] > 0
    for name in ("single", "batch", "e2e_p50", "e2e_p99"):
        for txb in ("txbroker-sync", "txbroker-async"):
            ratios = res["ratios"][name][txb]
            assert set(ratios) == measured - {txb}
            assert all(r > 0 for r in ratios.values())
    names = [f"{res['prefix']}-r{r}-{w}" for r in (1, 2) for w in ("single", "batch", "e2e")]
    assert asyncio.run(_leftovers(measured, names)) == []
    assert list(tmp_path.iterdir()) == []


async def _leftovers(measured: set[str], names: list[str]) -> list[str]:
    """Which of the run's queues and streams still exist on the local RabbitMQ and NATS."""
    left: list[str] = []
    if measured & {"rabbitmq-classic", "rabbitmq-quorum"}:
        import aio_pika

        async with await aio_pika.connect(RABBITMQ_URL) as conn:
            for name in names:
                channel = await conn.channel()  # a failed passive declare closes it
                try:
                    await channel.declare_queue(name, passive=True)
                    left.append(name)
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    pass
    if "nats-file" in measured:
        import nats

        nc = await nats.connect(NATS_URL)
        try:
            streams: list[Any] = await nc.jetstream().streams_info()
            left += [s.config.name for s in streams if s.config.name in names]
        finally:
            await nc.close()
    return left


def test_tables_show_figures_durability_and_ratios(tmp_path: Path) -> None:
    out = run_cli(
        "bench",
        "peers",
        *TINY,
        "--rounds",
        "1",
        "--workloads",
        "single",
        "--data-dir",
        str(tmp_path),
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("single sends: 300 x 1024 B, 32 in flight, one producer")
    assert "sync/this (msgs/s)" in lines[1] and "durability at the ack" in lines[1]
    rows = {line.split("  ")[0]: line for line in lines[2:] if line and "  " in line}
    assert "fdatasync before ack" in rows["txbroker sync flush"]
    assert rows["txbroker async flush"].count("x ") >= 1  # sync over async
    for label in ("RabbitMQ classic durable queue", "RabbitMQ quorum queue", "NATS JetStream"):
        row = next((r for name, r in rows.items() if name.startswith(label)), None)
        if row is None:
            assert "skipped" in out.stderr and label.split()[0] in out.stderr
        else:
            assert row.count("x ") == 2  # the ratio to txbroker sync and to async
    progress = [line for line in out.stderr.splitlines() if line.startswith("[")]
    assert progress and progress[-1].startswith(f"[{len(progress)}/")
