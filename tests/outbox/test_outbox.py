"""The outbox and its relay on a real broker and real databases (SQLite and PostgreSQL): every
committed row published exactly once and in key order, through relay crashes (kill -9 between
send and mark), several relays at once, and a broker restart."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine

from tests.conftest import ROOT, BrokerProcess, free_port, run_cli
from txbroker.errors import InvalidArgument
from txbroker_outbox import Relay, add
from txbroker_outbox.relay import DEFAULT_SHUTDOWN_TIMEOUT_S
from txbroker_sdk import Client, Consumer
from txbroker_sdk.database import async_url
from txbroker_sdk.tables import OUTBOX

TOPIC = "orders"


def _db_url(engine: AsyncEngine) -> str:
    return engine.url.render_as_string(hide_password=False)


async def _add_rows(engine: AsyncEngine, n: int, keys: int, per_tx: int = 50) -> None:
    """Rows n=0..n-1, key k{n % keys}; body {"n", "key", "seq"} (seq: position within its key)."""
    sessions = async_sessionmaker(engine)
    for start in range(0, n, per_tx):
        async with sessions() as session, session.begin():
            for i in range(start, min(start + per_tx, n)):
                key = f"k{i % keys}"
                body = {"n": i, "key": key, "seq": i // keys}
                await add(session, TOPIC, body, key=key)


async def _unpublished(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        q = sa.select(sa.func.count()).select_from(OUTBOX).where(OUTBOX.c.published_at.is_(None))
        return int(await conn.scalar(q) or 0)


async def _wait_all_published(engine: AsyncEngine, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := await _unpublished(engine)) > 0:
        assert time.monotonic() < deadline, f"{left} rows still unpublished"
        await asyncio.sleep(0.1)  # watching other processes' progress in the database


async def _consume(client: Client, expected: int, quiet_ms: int = 700) -> list[dict[str, object]]:
    """Everything on the topic, in consumption order; reads on past ``expected`` until the
    topic stays quiet, so a duplicate would show up."""
    out: list[dict[str, object]] = []
    deadline = time.monotonic() + 30
    async with Consumer(client, "check", TOPIC) as consumer:
        while True:
            batch = await consumer.fetch(timeout_ms=quiet_ms if len(out) >= expected else 1000)
            if not batch and len(out) >= expected:
                return out
            assert time.monotonic() < deadline, f"got {len(out)} of {expected}"
            for m in batch:
                body = json.loads(m.body)
                assert m.msg.key == body["key"]  # the row's key travels as the message key
                out.append(body)
                m.ack()


def _assert_once_in_key_order(got: list[dict[str, object]], n: int) -> None:
    assert sorted(int(str(b["n"])) for b in got) == list(range(n))  # each row exactly once
    last: dict[object, int] = {}
    for b in got:
        seq = int(str(b["seq"]))
        assert seq > last.get(b["key"], -1), f"key {b['key']} out of order at seq {seq}"
        last[b["key"]] = seq


@contextmanager
def _broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path / "broker").start()
    try:
        yield b
    finally:
        b.stop()


class RelayProcess:
    """A real `txbroker outbox relay` child; stderr goes to a file (nobody reads a pipe)."""

    def __init__(self, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "txbroker.cli", "outbox", "relay", *args],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=f,
                env={**os.environ, **(env or {})},
            )
        # Until it says "started" its SIGTERM handler is not installed: a stop() that early
        # would kill it with -15 instead of stopping it.
        deadline = time.monotonic() + 30
        while "outbox relay started" not in log.read_text() and self.proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)  # watching another process's log: there is no event to await

    def stop(self) -> int:
        """SIGTERM and wait (bounded); SIGKILL if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        return self.proc.returncode

    def counters(self) -> dict[str, int]:
        """The final `outbox relay stopped published=N ...` line."""
        lines = [ln for ln in self.log.read_text().splitlines() if "outbox relay stopped" in ln]
        assert lines, self.log.read_text()
        fields = lines[-1].split("outbox relay stopped ")[1].split()
        return {k: int(v) for k, v in (f.split("=") for f in fields)}


def _relay_args(db_url: str, broker: BrokerProcess, *extra: str) -> list[str]:
    return ["--url", db_url, "--server", broker.url, "--namespace", "orders-db", *extra]


async def test_relay_publishes_committed_rows_once_in_key_order(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    await _add_rows(engine, 60, keys=6, per_tx=10)
    sessions = async_sessionmaker(engine)
    with pytest.raises(RuntimeError):
        async with sessions() as session, session.begin():
            await add(session, TOPIC, {"n": -1, "key": "k0", "seq": -1}, key="k0")
            raise RuntimeError("the business transaction fails")
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(OUTBOX)) == 60
    with _broker(tmp_path) as broker:
        async with await Client.connect(broker.url) as client:
            await client.create_topic(TOPIC, queues=4)
            relay = Relay(client, engine, namespace="orders-db", batch_size=25)
            rounds = [await relay.publish_pending() for _ in range(4)]
            assert rounds == [25, 25, 10, 0]
            assert relay.published == 60 and relay.duplicates == 0
            assert await _unpublished(engine) == 0
            _assert_once_in_key_order(await _consume(client, 60), 60)  # and no n=-1


async def test_relay_killed_after_send_resends_as_duplicates(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    """Crash window 6: the relay sent rows, then died (SIGKILL) before marking them."""
    await _add_rows(engine, 30, keys=3)
    with _broker(tmp_path) as broker:
        async with await Client.connect(broker.url) as client:
            await client.create_topic(TOPIC, queues=4)
            args = _relay_args(_db_url(engine), broker)
            doomed = RelayProcess(
                tmp_path / "r1.log", *args, env={"TXB_FAULTS": "relay_after_send=@3"}
            )
            try:
                assert doomed.proc.wait(timeout=30) == -signal.SIGKILL, doomed.log.read_text()
            finally:
                doomed.stop()
            assert await _unpublished(engine) == 30  # sent (at least 3), none marked
            relay = RelayProcess(tmp_path / "r2.log", *args)
            try:
                await _wait_all_published(engine)
            finally:
                assert relay.stop() == 0, relay.log.read_text()
            counters = relay.counters()
            assert counters["published"] == 30
            assert counters["duplicates"] >= 3  # the broker recognised the resends
            _assert_once_in_key_order(await _consume(client, 30), 30)


async def test_three_relay_processes_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    """Crash window 7: several relays at once publish each row once and keep key order."""
    engine = create_async_engine(async_url(pg_url))
    try:
        await _add_rows(engine, 600, keys=20, per_tx=100)
        with _broker(tmp_path) as broker:
            async with await Client.connect(broker.url) as client:
                await client.create_topic(TOPIC, queues=4)
                args = _relay_args(pg_url, broker, "--batch", "50", "--poll-interval", "0.2")
                relays = [RelayProcess(tmp_path / f"r{i}.log", *args) for i in range(3)]
                try:
                    await _wait_all_published(engine)
                finally:
                    codes = [r.stop() for r in relays]
                assert codes == [0, 0, 0], [r.log.read_text() for r in relays]
                counters = [r.counters() for r in relays]
                # No row went through two relays: a second send would come back as a duplicate.
                assert sum(c["published"] for c in counters) == 600, counters
                assert all(c["duplicates"] == 0 for c in counters), counters
                _assert_once_in_key_order(await _consume(client, 600), 600)
    finally:
        await engine.dispose()


async def test_a_relay_skips_rows_another_holds_and_waits_behind_their_keys(
    pg_url: str, tmp_path: Path
) -> None:
    """Another relay holds rows 1-5 mid-batch: this one neither waits for them (SKIP LOCKED)
    nor publishes past them within their keys."""
    engine = create_async_engine(async_url(pg_url))
    try:
        sessions = async_sessionmaker(engine)
        async with sessions() as session, session.begin():
            for i, key in enumerate(["k1", "k2", "k3", "k4", "k5", "k1", "k2", "k6", "k7", None]):
                await add(session, TOPIC, {"n": i, "key": key, "seq": i}, key=key)
        with _broker(tmp_path) as broker:
            async with await Client.connect(broker.url) as client, engine.connect() as other:
                await client.create_topic(TOPIC, queues=4)
                await other.execute(
                    sa.select(OUTBOX.c.id).where(OUTBOX.c.id <= 5).with_for_update()
                )
                relay = Relay(client, engine, namespace="orders-db")
                assert await asyncio.wait_for(relay.publish_pending(), 5) == 3  # 8, 9, 10
                async with engine.connect() as conn:
                    q = sa.select(OUTBOX.c.id).where(OUTBOX.c.published_at.is_(None))
                    assert sorted(await conn.scalars(q)) == [1, 2, 3, 4, 5, 6, 7]
                await other.rollback()  # the other relay is gone without publishing
                assert await relay.publish_pending() == 7
                _assert_once_in_key_order(await _consume(client, 10), 10)  # k1: 0 before 5
    finally:
        await engine.dispose()


async def test_three_relays_on_sqlite(sqlite_url: str, tmp_path: Path) -> None:
    engine = create_async_engine(async_url(sqlite_url))
    try:
        await _add_rows(engine, 600, keys=20, per_tx=100)
        with _broker(tmp_path) as broker:
            async with await Client.connect(broker.url) as client:
                await client.create_topic(TOPIC, queues=4)
                relays = [
                    Relay(
                        client, engine, namespace="orders-db", batch_size=50, poll_interval_s=0.05
                    )
                    for _ in range(3)
                ]
                stop = asyncio.Event()
                runs = [asyncio.create_task(r.run(stop)) for r in relays]
                try:
                    await _wait_all_published(engine)
                finally:
                    stop.set()
                    await asyncio.wait_for(asyncio.gather(*runs), 10)
                assert sum(r.published for r in relays) == 600
                assert all(r.duplicates == 0 and r.errors == 0 for r in relays)
                _assert_once_in_key_order(await _consume(client, 600), 600)
    finally:
        await engine.dispose()


async def test_notify_wakes_the_relay_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    engine = create_async_engine(async_url(pg_url))
    try:
        with _broker(tmp_path) as broker:
            async with await Client.connect(broker.url) as client:
                await client.create_topic(TOPIC, queues=4)
                relay = Relay(client, engine, namespace="orders-db", poll_interval_s=30)
                stop = asyncio.Event()
                run = asyncio.create_task(relay.run(stop))
                try:
                    await asyncio.wait_for(relay.listening.wait(), 5)
                    rounds = relay.rounds
                    started = time.monotonic()
                    await _add_rows(engine, 1, keys=1)
                    await _wait_all_published(engine, timeout_s=5)
                    latency = time.monotonic() - started
                finally:
                    stop.set()
                    await asyncio.wait_for(run, 10)
                # A 30 s poll cannot explain this: the commit's NOTIFY woke the relay.
                assert relay.published == 1 and relay.rounds > rounds
                assert latency < 5
    finally:
        await engine.dispose()


async def test_relay_outlives_a_broker_restart(engine: AsyncEngine, tmp_path: Path) -> None:
    port = str(free_port())  # the restarted broker binds it again
    broker = BrokerProcess(tmp_path / "broker", "--port", port).start()
    try:
        client = await Client.connect(broker.url, reconnect_s=1)
        async with client:
            await client.create_topic(TOPIC, queues=4)
            relay = Relay(client, engine, namespace="orders-db", poll_interval_s=0.1)
            stop = asyncio.Event()
            run = asyncio.create_task(relay.run(stop))
            try:
                await _add_rows(engine, 1, keys=1)
                await _wait_all_published(engine, timeout_s=10)
                broker.kill()
                sessions = async_sessionmaker(engine)
                async with sessions() as session, session.begin():
                    for i in range(1, 5):
                        await add(session, TOPIC, {"n": i, "key": "k0", "seq": i}, key="k0")
                deadline = time.monotonic() + 15
                while relay.errors + relay.failed == 0:  # it notices the broker is gone
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.05)
                broker = BrokerProcess(tmp_path / "broker", "--port", port).start()
                await _wait_all_published(engine, timeout_s=15)
                assert not run.done()
            finally:
                stop.set()
                await asyncio.wait_for(run, 15)
            assert relay.published == 5
            _assert_once_in_key_order(await _consume(client, 5), 5)
    finally:
        broker.stop()


async def test_bad_input_gets_a_clear_error(engine: AsyncEngine, tmp_path: Path) -> None:
    sessions = async_sessionmaker(engine)
    bad_adds: list[tuple[str, dict[str, object]]] = [
        ("t" * 128, {}),  # longer than a topic name (and the column) may be
        ("%RETRY%billing", {}),  # a broker-internal topic
        ("bad topic", {}),
        (TOPIC, {"key": "has space"}),
        (TOPIC, {"key": "k" * 1025}),
        (TOPIC, {"key": ""}),
        (TOPIC, {"tags": "x" * 1025}),
        (TOPIC, {"headers": {"a": 1}}),
    ]
    for topic, kw in bad_adds:
        with pytest.raises(InvalidArgument):
            async with sessions() as session, session.begin():
                await add(session, topic, b"x", **kw)  # type: ignore[arg-type]
    async with engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(OUTBOX)) == 0

    client = Client("txb://127.0.0.1:1")  # never used: the arguments are refused first
    for ns in ("", "has space", "a:b", "n" * 129):
        with pytest.raises(InvalidArgument, match="namespace"):
            Relay(client, engine, namespace=ns)
    with pytest.raises(InvalidArgument, match="batch_size"):
        Relay(client, engine, namespace="ok", batch_size=0)
    with pytest.raises(InvalidArgument, match="poll_interval_s"):
        Relay(client, engine, namespace="ok", poll_interval_s=0)

    url = _db_url(engine)
    out = await asyncio.to_thread(
        run_cli, "outbox", "relay", "--url", url, "--namespace", "a b", timeout=60
    )
    assert out.returncode == 2 and "namespace" in out.stderr, out.stderr
    empty = f"sqlite:///{tmp_path / 'unmigrated.db'}"
    out = await asyncio.to_thread(
        run_cli, "outbox", "relay", "--url", empty, "--namespace", "ok", timeout=60
    )
    assert out.returncode == 2 and "txbroker db upgrade" in out.stderr, out.stderr


def test_a_relay_stops_within_its_grace_after_its_broker_is_gone(
    sqlite_url: str, broker: BrokerProcess, tmp_path: Path
) -> None:
    """The broker is killed and the relay's round is reconnecting to it (for up to 30 s):
    SIGTERM gives the round its grace, cancels it, and the process exits cleanly."""
    relay = RelayProcess(tmp_path / "r.log", *_relay_args(sqlite_url, broker))
    try:
        broker.kill()
        deadline = time.monotonic() + 30
        while "attempt 1 failed" not in relay.log.read_text():  # reconnecting to nothing
            assert relay.proc.poll() is None and time.monotonic() < deadline, relay.log.read_text()
            time.sleep(0.02)  # watching another process's log: there is no event to await
        started = time.monotonic()
        code = relay.stop()
        took = time.monotonic() - started
    finally:
        if relay.proc.poll() is None:
            relay.proc.kill()
            relay.proc.wait(timeout=10)
    assert code == 0, relay.log.read_text()
    assert took < DEFAULT_SHUTDOWN_TIMEOUT_S + 3.0, (took, relay.log.read_text())
    assert "outbox round still running 5.0 s after the stop: cancelled" in relay.log.read_text()
