"""@subscriber on a real broker and real databases: each message applied exactly once, also
when the consumer dies between its database commit and its ack; failures retry then DLQ;
concurrency in lanes keeps order per queue or per key; stop lets running handlers finish."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from tests.conftest import BrokerProcess, free_port
from txbroker.errors import InvalidArgument, NotFound
from txbroker.protocol.frames import Opcode
from txbroker.protocol.messages import DlqListResponse, DlqMessage, DlqRequest, SendRequest
from txbroker_sdk import Client, ConsumedMessage, Consumer
from txbroker_sdk.database import async_url
from txbroker_sdk.errors import ConnectionClosed
from txbroker_sdk.subscriber import Subscribers, apply_once
from txbroker_sdk.supervision import LoopState
from txbroker_sdk.tables import INBOX

PAYMENTS = sa.Table(
    "payments",
    sa.MetaData(),
    sa.Column("order_id", sa.String(32), primary_key=True),
)


async def _charge(session: AsyncSession, msg: ConsumedMessage) -> None:
    await session.execute(PAYMENTS.insert().values(order_id=msg.body.decode()))


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(sa.select(sa.func.count()).select_from(PAYMENTS)) or 0)


async def test_redelivery_after_commit_before_ack_is_skipped(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
    sessions = async_sessionmaker(engine)
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            for i in range(5):
                await c.send("orders", f"o{i}".encode())
            # A consumer applies everything, then "dies" before acknowledging anything.
            async with Consumer(c, "billing", "orders", member_id="doomed") as first:
                got: list[ConsumedMessage] = []
                while len(got) < 5:
                    got += await first.fetch(timeout_ms=500)
                for m in got:
                    assert await apply_once(sessions, "billing", m, _charge)
            # (no ack, so its commit on close has nothing to commit)
            subs = Subscribers(c, sessions)
            subs.subscriber("orders", group="billing")(_charge)
            stop = asyncio.Event()
            runner = asyncio.create_task(subs.run(stop))
            deadline = time.monotonic() + 15
            while subs.skipped < 5:
                assert time.monotonic() < deadline, (subs.applied, subs.skipped)
                await asyncio.sleep(0.05)  # watching the runner's counters
            stop.set()
            await asyncio.wait_for(runner, 10)
        assert await _count(engine) == 5 and subs.applied == 0  # effects applied once
    finally:
        broker.stop()


async def test_a_failing_handler_rolls_back_and_is_retried(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
    cfg = tmp_path / "fast.toml"
    cfg.write_text("retry_delays_ms = [100, 100]\nmax_reconsume = 2\n")
    broker = BrokerProcess(tmp_path / "b", "--config", str(cfg)).start()
    attempts: list[int] = []

    async def flaky(session: AsyncSession, msg: ConsumedMessage) -> None:
        attempts.append(msg.reconsume_count)
        await session.execute(PAYMENTS.insert().values(order_id="partial"))
        if len(attempts) < 3:
            raise RuntimeError("downstream timeout")  # the insert above must roll back

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            await c.send("orders", b"x")
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing")(flaky)
            stop = asyncio.Event()
            runner = asyncio.create_task(subs.run(stop))
            deadline = time.monotonic() + 15
            while subs.applied < 1:
                assert time.monotonic() < deadline, attempts
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.wait_for(runner, 10)
        assert attempts == [0, 1, 2] and subs.failed == 2
        assert await _count(engine) == 1  # only the successful attempt's write survived
    finally:
        broker.stop()


# --- concurrency, order, back-pressure, shutdown, dead letters ---------------------------------


def _runner(subs: Subscribers, stop: asyncio.Event) -> asyncio.Task[None]:
    return asyncio.create_task(subs.run(stop))


async def _until(cond: Callable[[], bool], what: object, timeout_s: float = 15) -> None:
    """Watch the runner's counters (another task) until ``cond`` holds, within a bound."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def _stop(stop: asyncio.Event, runner: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.wait_for(runner, 15)


async def _broker_with_payments(engine: AsyncEngine, tmp_path: Path, *extra: str) -> BrokerProcess:
    async with engine.begin() as conn:
        await conn.run_sync(PAYMENTS.metadata.create_all)
    return BrokerProcess(tmp_path / "b", *extra).start()


class _Lanes:
    """What the handlers saw: per lane, the sequence numbers in handling order, and whether
    two messages of one lane ever ran at once."""

    def __init__(self, barrier_at: int) -> None:
        self.seen: dict[object, list[int]] = {}
        self.busy: set[object] = set()
        self.overlapped_in_lane: list[object] = []
        self.running = 0
        self.max_running = 0
        self.firsts = 0
        self.all_firsts = asyncio.Event()
        self.barrier_at = barrier_at  # first messages that must run at once (0: no barrier)

    async def enter(self, lane: object, seq: int) -> None:
        if lane in self.busy:
            self.overlapped_in_lane.append(lane)
        self.busy.add(lane)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        first = lane not in self.seen
        self.seen.setdefault(lane, []).append(seq)
        if first and self.barrier_at:
            self.firsts += 1
            if self.firsts == self.barrier_at:
                self.all_firsts.set()
            # Only handlers that truly run at once can all get past this.
            await asyncio.wait_for(self.all_firsts.wait(), 10)
        for _ in range(seq * 7 % 5):  # uneven progress, to expose any reordering
            await asyncio.sleep(0)

    def leave(self, lane: object) -> None:
        self.busy.discard(lane)
        self.running -= 1


async def test_concurrency_runs_handlers_of_different_queues_at_once(
    pg_url: str, tmp_path: Path
) -> None:
    # PostgreSQL: on SQLite the transactions take turns (one writer), see the next tests.
    engine = create_async_engine(async_url(pg_url))
    broker = await _broker_with_payments(engine, tmp_path)
    started = 0
    all_in = asyncio.Event()

    async def handler(session: AsyncSession, msg: ConsumedMessage) -> None:
        nonlocal started
        started += 1
        if started == 4:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 10)  # only 4 handlers at once get past this
        await _charge(session, msg)

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=4)
            receipts = [await c.send("orders", f"o{i}".encode()) for i in range(4)]
            assert sorted(r.queue_id for r in receipts) == [0, 1, 2, 3]  # round-robin
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=4)(handler)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.applied + subs.failed >= 4, lambda: (started, subs.failed))
            await _stop(stop, runner)
        assert (subs.applied, subs.failed) == (4, 0) and await _count(engine) == 4
    finally:
        broker.stop()
        await engine.dispose()


async def test_order_per_queue_holds_under_concurrency(engine: AsyncEngine, tmp_path: Path) -> None:
    broker = await _broker_with_payments(engine, tmp_path)
    parallel = engine.dialect.name == "postgresql"
    # Two queues at once (the first two pulls start at different queues; a third lane's first
    # message may come only after a lane has finished one).
    lanes = _Lanes(barrier_at=2 if parallel else 0)

    async def handler(session: AsyncSession, msg: ConsumedMessage) -> None:
        await lanes.enter(msg.msg.queue_id, int(msg.body))
        try:
            await session.execute(PAYMENTS.insert().values(order_id=msg.body.decode()))
        finally:
            lanes.leave(msg.msg.queue_id)

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=4)
            for i in range(40):  # round-robin: 10 per queue, rising numbers in each
                await c.send("orders", str(i).encode())
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=4)(handler)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.applied + subs.failed >= 40, lambda: lanes.seen)
            await _stop(stop, runner)
        assert subs.failed == 0 and await _count(engine) == 40
        assert sorted(lanes.seen) == [0, 1, 2, 3] and lanes.overlapped_in_lane == []
        for queue, seqs in lanes.seen.items():
            assert seqs == sorted(seqs) and len(seqs) == 10, (queue, seqs)
        if parallel:
            assert lanes.max_running >= 2
    finally:
        broker.stop()


async def test_order_per_key_lets_keys_of_one_queue_run_at_once(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    broker = await _broker_with_payments(engine, tmp_path)
    parallel = engine.dialect.name == "postgresql"
    lanes = _Lanes(barrier_at=4 if parallel else 0)  # 4 keys of ONE queue at once

    async def handler(session: AsyncSession, msg: ConsumedMessage) -> None:
        key, seq = msg.msg.key, int(msg.body.split(b"/")[1])
        assert msg.msg.queue_id == 0
        await lanes.enter(key, seq)
        try:
            await session.execute(PAYMENTS.insert().values(order_id=msg.body.decode()))
        finally:
            lanes.leave(key)

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            for i in range(6):
                for k in range(4):
                    await c.send("orders", f"k{k}/{i}".encode(), key=f"k{k}")
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=4, order="key")(handler)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.applied + subs.failed >= 24, lambda: lanes.seen)
            await _stop(stop, runner)
        assert subs.failed == 0 and await _count(engine) == 24
        assert lanes.overlapped_in_lane == []
        assert lanes.seen == {f"k{k}": list(range(6)) for k in range(4)}
        if parallel:
            assert lanes.max_running >= 2
    finally:
        broker.stop()


async def test_sqlite_transactions_take_turns_instead_of_failing_on_the_lock(
    sqlite_url: str, tmp_path: Path
) -> None:
    # A short busy timeout: a handler that waited on SQLite's lock itself would fail quickly.
    engine = create_async_engine(async_url(sqlite_url), connect_args={"timeout": 0.05})
    broker = await _broker_with_payments(engine, tmp_path)

    async def slow(session: AsyncSession, msg: ConsumedMessage) -> None:
        await _charge(session, msg)  # holds SQLite's write lock from here to the commit
        await asyncio.sleep(0.2)  # a slow handler: the hazard, not a synchronisation

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=4)
            for i in range(4):
                await c.send("orders", f"o{i}".encode())
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=4)(slow)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.applied + subs.failed >= 4, lambda: subs.failed)
            await _stop(stop, runner)
        assert (subs.applied, subs.failed) == (4, 0) and await _count(engine) == 4
    finally:
        broker.stop()
        await engine.dispose()


async def test_a_slow_handler_stops_fetching_instead_of_buffering(
    sqlite_url: str, tmp_path: Path
) -> None:
    engine = create_async_engine(async_url(sqlite_url))
    broker = await _broker_with_payments(engine, tmp_path)
    release = asyncio.Event()

    async def blocked(session: AsyncSession, msg: ConsumedMessage) -> None:
        await asyncio.wait_for(release.wait(), 20)
        await _charge(session, msg)

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            await c.send_batch([SendRequest("orders", f"o{i:03}".encode()) for i in range(200)])
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=2)(blocked)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.admitted >= 8, subs.admitted)  # 4 x concurrency: full
            # Longer than a long poll (1 s): a runner that kept fetching would have more now.
            await asyncio.wait({runner}, timeout=1.5)
            # Admitted while there was room (< 8), plus one pull of main and retry topic (4 each).
            assert subs.admitted <= 7 + 2 * 4
            release.set()
            await _until(lambda: subs.applied >= 200, lambda: (subs.applied, subs.failed), 30)
            await _stop(stop, runner)
        assert await _count(engine) == 200
    finally:
        broker.stop()
        await engine.dispose()


async def test_stop_lets_running_handlers_finish_and_commits_them(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    broker = await _broker_with_payments(engine, tmp_path)
    # On SQLite one transaction runs at a time: one handler is mid-flight, three wait.
    running = 4 if engine.dialect.name == "postgresql" else 1
    started: list[bytes] = []
    all_started = asyncio.Event()
    release = asyncio.Event()

    async def held(session: AsyncSession, msg: ConsumedMessage) -> None:
        await _charge(session, msg)
        started.append(msg.body)
        if len(started) == running:
            all_started.set()
        await asyncio.wait_for(release.wait(), 20)

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=4)
            first = {f"o{i}".encode() for i in range(4)}
            for body in sorted(first):
                await c.send("orders", body)
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing", concurrency=4)(held)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await asyncio.wait_for(all_started.wait(), 10)
            stop.set()
            # Longer than a long poll: the runner has seen the stop and is waiting for them.
            done, _ = await asyncio.wait({runner}, timeout=1.5)
            assert not done and subs.applied == 0
            release.set()
            await asyncio.wait_for(runner, 10)
            assert (subs.applied, subs.failed) == (running, 0)
            assert await _count(engine) == running  # committed

            # A new member of the group: what finished is not delivered again (it was acked
            # and the offsets committed); what never started is.
            again = Subscribers(c, async_sessionmaker(engine))
            seen: list[bytes] = []

            async def record(session: AsyncSession, msg: ConsumedMessage) -> None:
                seen.append(msg.body)
                await _charge(session, msg)

            again.subscriber("orders", group="billing", concurrency=4)(record)
            markers = {f"m{i}".encode() for i in range(4)}  # one per queue, after the rest
            for body in sorted(markers):
                await c.send("orders", body)
            stop2 = asyncio.Event()
            runner2 = _runner(again, stop2)
            await _until(lambda: markers <= set(seen), seen)
            await _stop(stop2, runner2)
        assert again.skipped == 0  # nothing that had been applied came back
        assert sorted(seen) == sorted((first - set(started)) | markers)
        assert await _count(engine) == 8
    finally:
        broker.stop()


async def test_shutdown_timeout_cancels_a_stuck_handler_and_it_is_redelivered(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    broker = await _broker_with_payments(engine, tmp_path)
    entered = asyncio.Event()

    async def stuck(session: AsyncSession, msg: ConsumedMessage) -> None:
        await _charge(session, msg)
        entered.set()
        await asyncio.wait_for(asyncio.Event().wait(), 60)  # never released

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            await c.send("orders", b"o1")
            subs = Subscribers(c, async_sessionmaker(engine), shutdown_timeout_s=0.3)
            subs.subscriber("orders", group="billing")(stuck)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await asyncio.wait_for(entered.wait(), 10)
            t0 = time.monotonic()
            await _stop(stop, runner)
            assert time.monotonic() - t0 < 5  # the hold of a long poll + 0.3 s, not 60 s
            assert subs.applied == 0 and await _count(engine) == 0  # rolled back

            again = Subscribers(c, async_sessionmaker(engine))
            again.subscriber("orders", group="billing")(_charge)
            stop2 = asyncio.Event()
            runner2 = _runner(again, stop2)
            await _until(lambda: again.applied >= 1, again.failed)
            await _stop(stop2, runner2)
        assert (again.applied, again.skipped) == (1, 0) and await _count(engine) == 1
    finally:
        broker.stop()


async def test_a_handler_that_always_fails_is_dead_lettered_with_no_partial_effect(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    cfg = tmp_path / "fast.toml"
    cfg.write_text("retry_delays_ms = [100, 100]\nmax_reconsume = 2\n")
    broker = await _broker_with_payments(engine, tmp_path, "--config", str(cfg))
    attempts: list[int] = []

    async def poison(session: AsyncSession, msg: ConsumedMessage) -> None:
        attempts.append(msg.reconsume_count)
        await session.execute(PAYMENTS.insert().values(order_id="partial"))
        raise RuntimeError("always fails")  # the insert above must never survive

    async def dead_letters(c: Client) -> list[DlqMessage]:
        try:
            res: DlqListResponse = await c.request(Opcode.DLQ_LIST, DlqRequest("billing"))
        except NotFound:  # the group's first heartbeat creates its DLQ topic
            return []
        return res.messages

    try:
        async with await Client.connect(broker.url) as c:
            await c.create_topic("orders", queues=1)
            sent = await c.send("orders", b"poison")
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing")(poison)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            deadline = time.monotonic() + 15
            while not await dead_letters(c):
                assert time.monotonic() < deadline, attempts
                await asyncio.sleep(0.05)  # watching the broker
            await _stop(stop, runner)
            dlq = await dead_letters(c)
        # First delivery + max_reconsume retries, each rolled back and nacked; the last nack
        # dead-letters it, once.
        assert attempts == [0, 1, 2] and (subs.failed, subs.applied) == (3, 0)
        assert [(m.message_id, m.original_topic, m.reconsume_count) for m in dlq] == [
            (sent.message_id, "orders", 3)
        ]
        assert await _count(engine) == 0
        async with engine.connect() as conn:
            inbox = await conn.scalar(sa.select(sa.func.count()).select_from(INBOX))
        assert inbox == 0
    finally:
        broker.stop()


def test_bad_subscriber_arguments_are_refused() -> None:
    subs = Subscribers(None, None)  # type: ignore[arg-type]  # validation needs neither
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidArgument, match="concurrency"):
            subs.subscriber("orders", group="g", concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="order must be"):
        subs.subscriber("orders", group="g", order="none")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="shutdown_timeout_s"):
        Subscribers(None, None, shutdown_timeout_s=0)  # type: ignore[arg-type]
    subs.subscriber("orders", group="g")(_charge)
    with pytest.raises(InvalidArgument, match="one topic per group"):
        subs.subscriber("refunds", group="g")  # its retries would reach _charge


async def test_the_runner_survives_a_broker_restart(
    sqlite_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "txbroker_sdk")
    port = str(free_port())  # the restarted broker binds it again
    engine = create_async_engine(async_url(sqlite_url))
    broker = await _broker_with_payments(engine, tmp_path, "--port", port)
    try:
        # Reconnects give up after 0.3 s, so the runner's fetch really fails while the broker
        # is down (a longer reconnect window would hide the outage inside one request).
        async with Client(broker.url, reconnect_s=0.3) as c:
            await c.create_topic("orders", queues=1)
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing")(_charge)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await c.send("orders", b"before")
            await _until(lambda: subs.applied == 1, "first message")
            [(health, _)] = subs.loops()
            assert health.state is LoopState.RUNNING
            broker.kill()
            await _until(
                lambda: runner.done() or health.state is LoopState.RETRYING,
                "the runner never noticed the broker was gone",
            )
            assert not runner.done(), runner.exception()  # it outlived the failed fetch
            assert "subscriber orders (group billing) failed: ConnectionClosed" in caplog.text
            broker = BrokerProcess(tmp_path / "b", "--port", port).start()
            for attempt in range(3):  # a send in flight over a dropped connection is unknown:
                try:  # resend it with its idempotency key
                    await c.send("orders", b"after", idempotency_key="after")
                    break
                except ConnectionClosed:
                    assert attempt < 2
            await _until(lambda: subs.applied == 2, (subs.applied, subs.failed), timeout_s=30)
            assert not runner.done()
            assert health.state is LoopState.RUNNING  # it works again, and says so
            assert "subscriber orders (group billing): working again" in caplog.text
            await _stop(stop, runner)
        assert await _count(engine) == 2
    finally:
        broker.stop()
        await engine.dispose()


async def test_the_runner_survives_a_broker_error_on_a_pull_and_skips_nothing(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker answering a PULL with an error of its own (the chaos campaign's
    InvalidOffset after a store's cut) must not end run(): the same position is asked again
    and every message is applied once."""
    from txbroker.errors import InvalidOffset

    engine = create_async_engine(async_url(sqlite_url))
    broker = await _broker_with_payments(engine, tmp_path)
    real = Consumer._fetch_own
    fails = {"left": 3}

    async def flaky(self: Consumer, timeout_ms: int | None = None) -> list[ConsumedMessage]:
        if self.topic == "orders" and fails["left"]:
            fails["left"] -= 1
            raise InvalidOffset("physical offset 27375 is not the start of a record")
        return await real(self, timeout_ms)

    monkeypatch.setattr(Consumer, "_fetch_own", flaky)
    try:
        async with Client(broker.url) as c:
            await c.create_topic("orders", queues=1)
            for i in range(5):
                await c.send("orders", f"o{i}".encode())
            subs = Subscribers(c, async_sessionmaker(engine))
            subs.subscriber("orders", group="billing")(_charge)
            stop = asyncio.Event()
            runner = _runner(subs, stop)
            await _until(lambda: subs.applied == 5 or runner.done(), "all applied", timeout_s=30)
            assert not runner.done(), runner.exception()
            assert subs.fetch_errors == 3 and subs.applied == 5
            await _stop(stop, runner)
        assert await _count(engine) == 5
    finally:
        broker.stop()
        await engine.dispose()
