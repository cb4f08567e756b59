"""The broker process: open the store, serve TCP, stop cleanly on SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import logging
import sys

from txbroker import __version__
from txbroker.protocol.frames import PROTOCOL_VERSION
from txbroker.protocol.messages import Hello, HelloOk
from txbroker.runtime.brokerproc import READY_PREFIX
from txbroker.runtime.httpserve import HttpServer
from txbroker.runtime.signals import stop_on_signals
from txbroker.server.admin import Admin
from txbroker.server.config import ServerConfig
from txbroker.server.connection import Connection
from txbroker.server.consumer import ConsumerService
from txbroker.server.delay import DelayScheduler
from txbroker.server.groups import GroupCoordinator
from txbroker.server.handlers import build_direct_handlers, build_handlers
from txbroker.server.http import build_http_app
from txbroker.server.longpoll import Notifier
from txbroker.server.metrics import BrokerMetrics
from txbroker.server.producer import Producer
from txbroker.server.retry import RetryService
from txbroker.server.topics import TopicRegistry
from txbroker.server.txports import TxPublishing
from txbroker.store import MessageStore, StoreConfig
from txbroker.store.snapshot import Snapshot
from txbroker.tx.checker import BackChecker, CheckSettings
from txbroker.tx.coordinator import TxCoordinator, TxSettings

__all__ = ["BrokerServer", "serve"]

log = logging.getLogger(__name__)


class BrokerServer:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.store: MessageStore | None = None
        self.topics = TopicRegistry(config.data_dir / "meta")
        self.groups = GroupCoordinator(
            config.data_dir / "meta", session_timeout_ms=config.session_timeout_ms
        )
        self.consumer: ConsumerService | None = None
        self.scheduler: DelayScheduler | None = None
        self.tx: TxCoordinator | None = None
        self.checker: BackChecker | None = None
        self._notifier: Notifier | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._admin: Admin | None = None
        self.metrics: BrokerMetrics | None = None
        self._http: HttpServer | None = None
        self.http_port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        self.port = 0

    async def start(self) -> None:
        cfg = self.config
        self.store = await MessageStore.open(
            StoreConfig(
                cfg.data_dir / "store",
                flush=cfg.flush,
                segment_bytes=cfg.segment_bytes,
                index_capacity=cfg.index_capacity,
                # Slots scale with capacity (about two entries a slot at capacity).
                index_slots=max(cfg.index_capacity // 2, 1),
                truncate_damaged_tail=cfg.repair_truncate,
            )
        )
        self.topics.load()
        self.groups.load()
        notifier = self._notifier = Notifier()
        self.scheduler = DelayScheduler(
            self.store, self.topics, cfg.data_dir / "meta", notifier.notify
        )
        self.scheduler.load()
        self.scheduler.start()
        producer = Producer(
            self.store,
            self.topics,
            dedup_window_ms=cfg.dedup_window_ms,
            notifier=notifier,
            scheduler=self.scheduler,
        )
        retry = RetryService(
            self.store,
            self.topics,
            self.groups,
            self.scheduler,
            notifier,
            delays_ms=cfg.retry_delays_ms,
            max_reconsume=cfg.max_reconsume,
        )
        self.consumer = ConsumerService(self.store, self.topics, self.groups, notifier, retry)
        self.tx = TxCoordinator(
            self.store,
            TxPublishing(producer, self.scheduler, self.topics),
            cfg.data_dir / "meta",
            TxSettings(
                cfg.tx_timeout_ms, secrets=cfg.tx_secrets, default_secret=cfg.tx_default_secret
            ),
            notifier.notify,
        )
        await self.tx.recover()
        self.checker = BackChecker(
            self.tx,
            CheckSettings(
                cfg.check_backoff_base_ms,
                cfg.check_backoff_cap_ms,
                cfg.max_checks,
                cfg.check_concurrency,
                cfg.check_rate_per_s,
                cfg.check_timeout_ms,
            ),
        )
        self.tx.on_prepared = self.checker.schedule
        self.checker.start()
        admin = self._admin = Admin(self.store, self.topics, self.groups)
        handlers = build_handlers(admin, self.topics, producer, self.consumer, retry, self.tx)
        direct = build_direct_handlers(self.tx)
        self._housekeeping = asyncio.create_task(self._housekeep(), name="txb-groups")

        def hello(_: Hello) -> HelloOk:
            return HelloOk(__version__, PROTOCOL_VERSION)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(
                handlers,
                auth_token=cfg.auth_token,
                hello=hello,
                connections=self._connections,
                direct=direct,
            ),
            cfg.host,
            cfg.port,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.metrics = BrokerMetrics(
            self.store,
            self.topics,
            self.groups,
            admin,
            self.tx,
            self.checker,
            gauges={
                "txbroker.server.connections": (
                    "Client connections open.",
                    lambda: len(self._connections),
                ),
                "txbroker.server.longpolls": (
                    "Consumer fetches held open, waiting for messages.",
                    lambda: notifier.waiting,
                ),
                "txbroker.delay.pending": (
                    "Delayed messages not yet due.",
                    self.scheduler.pending,
                ),
            },
        )
        app = build_http_app(
            self.store,
            self.topics,
            admin,
            self.scheduler,
            auth_token=cfg.auth_token,
            tx=self.tx,
            checker=self.checker,
            metrics=self.metrics,
        )
        self._http = HttpServer(app, cfg.host, cfg.http_port)
        await self._http.start()
        self.http_port = self._http.port

    async def _housekeep(self) -> None:
        """Expire silent group members, sample the rates operators see and persist committed
        offsets, once a second."""
        while True:
            await asyncio.sleep(1)
            self.groups.expire_all()
            if self._admin is not None:
                self._admin.sample()
            if self.metrics is not None:
                self.metrics.drain_fsyncs()
            for snap in self._snapshots():
                try:
                    await snap.save_async()
                except OSError:
                    log.exception("cannot persist %s; will retry", snap.path.name)

    def _snapshots(self) -> list[Snapshot]:
        owners = (self.groups, self.scheduler, self.tx)
        return [o.snapshot for o in owners if o is not None]

    async def stop(self) -> None:
        """Stop accepting, answer what is in flight (bounded), flush and close the store."""
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            await asyncio.gather(self._housekeeping, return_exceptions=True)
        if self._http is not None:
            await self._http.stop()
        if self.metrics is not None:
            self.metrics.shutdown()
        if self._server is not None:
            self._server.close()
        if self.consumer is not None and self._notifier is not None:
            self.consumer.stopping = True
            self._notifier.wake_all()  # held long polls answer (empty) now, not in 30 s
        conns = list(self._connections)
        if conns:
            await asyncio.wait(
                [asyncio.ensure_future(c.drain_requests()) for c in conns],
                timeout=self.config.shutdown_grace_ms / 1000,
            )
        for c in conns:
            c.closing = True
            if c._transport is not None:
                c._transport.close()
        if self._server is not None:
            await self._server.wait_closed()
        await self.groups.snapshot.save_async()
        if self.checker is not None:
            await self.checker.stop()
        if self.tx is not None:
            await self.tx.snapshot.save_async()
        if self.scheduler is not None:
            await self.scheduler.stop()
        if self.store is not None:
            await self.store.close()


async def serve(config: ServerConfig) -> None:
    server = BrokerServer(config)
    await server.start()
    stop = stop_on_signals()
    print(
        f"{READY_PREFIX} tcp={config.host}:{server.port} http={config.host}:{server.http_port} "
        f"data={config.data_dir} "
        f"flush={config.flush.value}",
        flush=True,
    )
    await stop.wait()
    print("txbroker stopping: answering in-flight requests, flushing the store", file=sys.stderr)
    await server.stop()
    print("txbroker stopped", file=sys.stderr, flush=True)
