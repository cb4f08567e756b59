"""One scenario's world: a broker process, the orders and billing services as child processes
(:mod:`txbroker.chaos.service`), a plain producer in this process, and the checks once it has
settled.

What must hold afterwards, with every process up again and the load stopped: every plain send
the broker acknowledged, every transaction the orders database committed and every outbox row
committed with it is applied exactly once in the billing database (``chaos_effects``); nothing
the orders database rolled back is applied; every transaction at the broker is decided and
every outbox row published.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from txbroker.chaos import diagnosis
from txbroker.chaos.cluster import Cluster
from txbroker.chaos.diagnosis import Broker
from txbroker.chaos.figures import Figures
from txbroker.chaos.pgserver import PrivatePostgres
from txbroker.chaos.procs import Child, Progress, free_port
from txbroker.chaos.proxy import FaultProxy
from txbroker.chaos.service import EFFECTS, GROUP, ORDERS, ORDERS_TABLE, PLAIN, SUBSCRIPTIONS
from txbroker.errors import StoreFailed, TxbError
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker_sdk import Client
from txbroker_sdk.cluster import client_for
from txbroker_sdk.database import create_engine
from txbroker_sdk.schema import upgrade
from txbroker_sdk.tables import LOCAL_TX, OUTBOX

__all__ = ["BROKER_SETTINGS", "SECRET", "World", "WorldSpec"]

SECRET: Final = "chaos-secret"
# Back-checks soon after a transaction was left open (a killed service, a lost END_TX) and
# often while its service is down, so a round settles in seconds; never parked (an endpoint
# that is down is retried, and 1,000 answered checks are far more than a campaign makes).
BROKER_SETTINGS: Final = """
tx_timeout_ms = 1000
check_backoff_base_ms = 200
check_backoff_cap_ms = 1000
check_timeout_ms = 2000
max_checks = 1000
"""
# The plain producer: sends in flight at once (the broker's group commit gathers them).
PRODUCERS: Final = 4
RETRY_PAUSE_S: Final = 0.2  # after a failed send: no hot loop against a broker that is down
SETTLE_POLL_S: Final = 0.2  # reading other processes' databases: polled, nothing to await


@dataclass
class WorldSpec:
    """Where a world lives and what it talks to. Database URLs default to SQLite files in
    ``root``; ``data_dir`` to ``root/broker`` (a small filesystem for the disk-full scenario)."""

    root: Path
    orders_url: str = ""
    billing_url: str = ""
    data_dir: Path | None = None
    broker_extra: tuple[str, ...] = ()
    broker_port: int = 0  # 0: a free one
    service_url: str = ""  # what the services and the producer use (default: the broker's)
    # Where the orders service answers back-checks: an address of this machine the brokers
    # reach (a test net's gateway when they run on test hosts).
    service_host: str = "127.0.0.1"
    proxy: FaultProxy | None = None  # the network-faults scenario's
    postgres: PrivatePostgres | None = None  # the database-restart scenario's
    disk: Path | None = None  # the disk-full scenario's small filesystem
    # The failover scenario's broker groups, in place of the one broker (its setting starts
    # and stops them; service_url is its NameServer).
    cluster: Cluster | None = None
    settle_s: float = 90.0
    client_timeout_s: float = 5.0
    lifetime_s: float = 900.0


@dataclass
class Settled:
    open_transactions: int = -1
    unpublished: int = -1
    missing: int = -1
    notes: list[str] = field(default_factory=list)


class World:
    """``async with World(spec) as w``: the broker and both services started, the plain
    producer ready (``await w.produce(n)`` lets it send ``n`` more); everything is stopped
    when the block ends, whatever happened in it."""

    def __init__(self, spec: WorldSpec) -> None:
        self.spec = spec
        spec.root.mkdir(parents=True, exist_ok=True)
        self.orders_url = spec.orders_url or f"sqlite:///{spec.root / 'orders.db'}"
        self.billing_url = spec.billing_url or f"sqlite:///{spec.root / 'billing.db'}"
        self.data_dir = spec.data_dir or spec.root / "broker"
        self.progress = Progress()
        self.acked: set[str] = set()
        self.quota = 0  # plain sends allowed so far (acknowledged or in flight)
        self.sent = 0  # plain sends started
        self.refused = 0  # plain sends the broker refused with STORE_FAILED
        self.pad = 0  # bytes added to each plain body (after a "|", not part of its id)
        self._stopping = False
        self._producers: list[asyncio.Task[None]] = []
        self.rng = random.Random()
        cfg = spec.root / "broker.toml"
        cfg.write_text(BROKER_SETTINGS)
        self.broker_port = spec.broker_port or free_port()
        self.broker = BrokerProcess(
            self.data_dir,
            "--segment-mib",
            "8",
            "--config",
            str(cfg),
            "--tx-secret",
            f"{GROUP}={SECRET}",
            "--port",
            str(self.broker_port),
            "--http-port",
            str(free_port()),
            *spec.broker_extra,
            env={"TXB_INDEX_CAPACITY": "65536"},
        )
        self.broker.log_path = spec.root / "broker.log"  # not on a disk the campaign fills
        self.service_url = spec.service_url  # what the services and the producer use
        self.orders: Child | None = None
        self._orders_starts = 0
        self.billing: Child | None = None

    # --- start and stop ---

    async def __aenter__(self) -> World:
        try:
            cluster = self.spec.cluster
            if cluster is None:
                await self.start_broker()
                self.service_url = self.service_url or self.broker.url
            for url in (self.orders_url, self.billing_url):
                await asyncio.to_thread(upgrade, url)
            if cluster is not None:  # every topic spread over every group
                for topic, _ in SUBSCRIPTIONS:
                    await cluster.create_topic(topic, queues=2 * len(cluster.groups))
            else:
                async with Client(self.broker.url) as admin:
                    for topic, _ in SUBSCRIPTIONS:
                        await admin.create_topic(topic, queues=2, exist_ok=True)
            self.billing = self._child("billing", ["--db", self.billing_url])
            await self.billing.start()
            self.orders = self._child(
                "orders",
                [
                    *("--db", self.orders_url, "--host", self.spec.service_host),
                    *("--port", str(free_port()), "--secret", SECRET),
                ],
            )
            await self.orders.start(extra=self.orders_prefix())
            self._producers = [asyncio.create_task(self._produce()) for _ in range(PRODUCERS)]
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _child(self, role: str, args: list[str]) -> Child:
        common = ["--broker", self.service_url, "--timeout-s", str(self.spec.client_timeout_s)]
        common += ["--lifetime-s", str(self.spec.lifetime_s)]
        log = self.spec.root / f"{role}.log"
        return Child(role, [*args, *common], log, self.progress, {})

    def orders_prefix(self) -> tuple[str, ...]:
        """Order ids of each start of the orders service are new: ``s<start>-<n>``."""
        self._orders_starts += 1
        return ("--prefix", f"s{self._orders_starts}-")

    @property
    def broker_running(self) -> bool:
        return self.broker.proc is not None and self.broker.proc.poll() is None

    async def start_broker(self) -> None:
        await asyncio.to_thread(self.broker.start)

    async def close(self) -> None:
        self._stopping = True
        await self.progress.poke()
        for t in self._producers:
            t.cancel()
        await asyncio.gather(*self._producers, return_exceptions=True)
        for child in (self.orders, self.billing):
            if child is not None:
                await child.stop()
        if self.broker.proc is not None:
            if self.broker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    self.broker.proc.send_signal(signal.SIGCONT)  # a stopped one cannot stop
            await asyncio.to_thread(self.broker.stop)

    # --- the plain producer ---

    async def produce(self, n: int) -> None:
        """Let the producer send ``n`` more messages."""
        self.quota += n
        await self.progress.poke()

    async def _produce(self) -> None:
        async with client_for(self.service_url, timeout_s=self.spec.client_timeout_s) as c:
            while True:
                await self.progress.wait_for(
                    lambda: self.sent < self.quota or self._stopping, self.spec.lifetime_s
                )
                if self._stopping:
                    return
                self.sent += 1
                body = f"p{self.sent}"
                data = body.encode() + (b"|" + bytes(self.pad) if self.pad else b"")
                try:
                    await c.send(PLAIN, data, key=body)
                except StoreFailed:
                    self.refused += 1
                    await self.progress.bump("refused")
                    continue
                except TxbError:
                    await self.progress.bump("errors")  # waiters look again (a dead broker?)
                    await asyncio.sleep(RETRY_PAUSE_S)  # a pause before the next, not a wait
                    continue
                self.acked.add(body)
                await self.progress.bump("plain")

    async def wait_plain(self, n: int, timeout_s: float) -> bool:
        """Until ``n`` plain sends in all were acknowledged."""
        return await self.progress.wait_for(lambda: len(self.acked) >= n, timeout_s)

    # --- settling and the checks ---

    async def stop_load(self) -> None:
        self.quota = self.sent  # the producer sends no more
        assert self.orders is not None
        if self.orders.running:
            before = self.progress.get("orders.done")
            self.orders.signal(signal.SIGUSR1)
            await self.progress.wait_for(
                lambda: self.progress.get("orders.done") > before or not self.orders_running,
                self.spec.settle_s,
            )

    @property
    def orders_running(self) -> bool:
        return self.orders is not None and self.orders.running

    async def settle_and_check(self, figures: Figures) -> None:
        """Stop the load, wait (bounded) until everything settled, and fill in ``figures``."""
        await self.stop_load()
        orders = create_engine(self.orders_url)
        billing = create_engine(self.billing_url)
        try:
            settled = await self._settle(orders, billing)
            await self._check(orders, billing, settled, figures)
        finally:
            await orders.dispose()
            await billing.dispose()

    async def _expected(self, orders: AsyncEngine) -> tuple[set[str], set[str]]:
        async with orders.connect() as conn:
            committed = set(
                (
                    await conn.scalars(
                        sa.select(LOCAL_TX.c.key).where(LOCAL_TX.c.state == "committed")
                    )
                ).all()
            )
            audits = {bytes(b).decode() for b in (await conn.scalars(sa.select(OUTBOX.c.body)))}
        return committed, audits

    async def _applied(self, billing: AsyncEngine) -> Counter[str]:
        async with billing.connect() as conn:
            rows = await conn.execute(
                sa.select(EFFECTS.c.ref, sa.func.count()).group_by(EFFECTS.c.ref)
            )
            return Counter({ref: n for ref, n in rows.all()})

    async def orders_outcome(self) -> tuple[set[str], Counter[str]]:
        """The orders the orders database committed, and how many times the billing database
        applied each order's message (both by order id)."""
        orders = create_engine(self.orders_url)
        billing = create_engine(self.billing_url)
        try:
            committed, _ = await self._expected(orders)
            applied = await self._applied(billing)
        finally:
            await orders.dispose()
            await billing.dispose()
        prefix = f"{ORDERS}:"
        return committed, Counter(
            {ref[len(prefix) :]: n for ref, n in applied.items() if ref.startswith(prefix)}
        )

    def expected_refs(self, committed: set[str], audits: set[str]) -> set[str]:
        return (
            {f"orders:{k}" for k in committed}
            | {f"audit:{a}" for a in audits}
            | {f"{PLAIN}:{p}" for p in self.acked}
        )

    async def _settle(self, orders: AsyncEngine, billing: AsyncEngine) -> Settled:
        s = Settled()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.settle_s
        while True:
            try:
                s.open_transactions = await self._open_transactions()
            except TxbError as e:
                s.notes.append(f"listing transactions failed: {e}")
            committed, audits = await self._expected(orders)
            async with orders.connect() as conn:
                q = sa.select(sa.func.count()).where(OUTBOX.c.published_at.is_(None))
                s.unpublished = int(await conn.scalar(q.select_from(OUTBOX)) or 0)
            applied = await self._applied(billing)
            s.missing = len(self.expected_refs(committed, audits) - set(applied))
            if s.open_transactions == 0 and s.unpublished == 0 and s.missing == 0:
                return s
            if loop.time() > deadline:
                s.notes.append(
                    f"not settled in {self.spec.settle_s:.0f} s: {s.open_transactions} open "
                    f"transactions, {s.unpublished} outbox rows unpublished, {s.missing} "
                    "effects missing"
                )
                return s
            await asyncio.sleep(SETTLE_POLL_S)

    async def logs(self) -> Path | dict[str, Path]:
        """The commit log to reconcile: the broker's data, or each group's master's."""
        cluster = self.spec.cluster
        if cluster is None:
            return self.data_dir
        masters = await cluster.masters()
        return {g: cluster.member(b.broker_id).proc.data_dir for g, b in masters.items()}

    async def _diagnose(self, lost: set[str], twice: set[str], f: Figures) -> list[str]:
        """A line per lost or twice-applied effect, from the logs as settled."""
        cluster = self.spec.cluster
        if cluster is None:
            logs = {"": self.data_dir}
            brokers = [Broker("broker", "", self.data_dir)]
            masters = {"": "broker"}
            terms: dict[tuple[str, int], str] = {}
        else:
            infos = await cluster.masters()
            masters = {g: b.broker_id for g, b in infos.items()}
            logs = {g: cluster.member(b).proc.data_dir for g, b in masters.items()}
            brokers = [Broker(m.broker_id, m.group, m.proc.data_dir) for m in cluster.members]
            terms = cluster.terms
        groups = {topic: group for topic, group in SUBSCRIPTIONS}
        topics = list(groups)

        def lines() -> list[str]:
            out = []
            for kind, refs in (("lost", lost), ("applied twice", twice)):
                found = diagnosis.find(logs, refs, topics)
                out += diagnosis.explain(kind, found, brokers, masters, groups, f.fault_ms, terms)
            return out

        return await asyncio.to_thread(lines)

    async def _open_transactions(self) -> int:
        if self.spec.cluster is not None:
            return await self.spec.cluster.open_transactions()
        async with Client(self.broker.url) as admin:
            return (await admin.list_transactions(limit=1)).total

    async def _check(
        self,
        orders: AsyncEngine,
        billing: AsyncEngine,
        settled: Settled,
        f: Figures,
    ) -> None:
        committed, audits = await self._expected(orders)
        async with orders.connect() as conn:
            rows = set((await conn.scalars(sa.select(ORDERS_TABLE.c.id))).all())
        applied = await self._applied(billing)
        expected = self.expected_refs(committed, audits)
        lost = expected - set(applied)
        twice = {r for r, n in applied.items() if n > 1}
        f.acknowledged += len(expected)
        f.lost += len(lost)
        f.duplicated += sum(applied[r] - 1 for r in twice)
        if lost or twice:
            f.findings += await self._diagnose(lost, twice, f)
        placed = self.orders.placed if self.orders is not None else set()
        problems = {
            "orders whose row and barrier disagree": len(rows ^ committed),
            "orders returned but not committed": len(placed - committed),
            "orders applied against a rolled-back or missing local transaction": sum(
                1 for r in applied if r.startswith("orders:") and r[7:] not in committed
            ),
            "audits applied without an outbox row": sum(
                1 for r in applied if r.startswith("audit:") and r[6:] not in audits
            ),
            "transactions left open at the broker": max(settled.open_transactions, 0),
            "outbox rows left unpublished": max(settled.unpublished, 0),
        }
        f.anomalies += sum(problems.values())
        f.notes += settled.notes + [f"{n} {what}" for what, n in problems.items() if n]
