"""The broker process: open the store, serve TCP, stop cleanly on SIGTERM / SIGINT."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import ssl
import sys
from collections.abc import Callable, Sequence
from typing import TypeAlias

from starlette.routing import BaseRoute, Mount

from txbroker import __version__
from txbroker.cluster.routes import BrokerInfo
from txbroker.protocol.frames import PROTOCOL_VERSION
from txbroker.protocol.messages import Hello, HelloOk
from txbroker.protocol.wrongport import http_port_note
from txbroker.runtime.brokerproc import READY_PREFIX
from txbroker.runtime.build import BUILD
from txbroker.runtime.fdlimit import FileLimit, open_files, raise_nofile_limit
from txbroker.runtime.gctune import tune_for_serving
from txbroker.runtime.httpserve import HttpServer
from txbroker.runtime.signals import stop_on_signals
from txbroker.runtime.tls import TlsFiles, client_context, server_context
from txbroker.server.access import Access
from txbroker.server.admin import Admin
from txbroker.server.admission import FILES_MARGIN, Admission, Limits, fit_limits
from txbroker.server.config import ServerConfig
from txbroker.server.connection import Connection, Handler
from txbroker.server.consumer import ConsumerService
from txbroker.server.delay import DelayScheduler
from txbroker.server.deletion import TopicDeletion
from txbroker.server.failover import Failover, MasterDuties
from txbroker.server.groups import GroupCoordinator
from txbroker.server.handlers import build_handlers
from txbroker.server.http import build_http_app, tcp_requests
from txbroker.server.longpoll import Notifier
from txbroker.server.membership import Membership, MembershipSettings
from txbroker.server.metrics import BrokerMetrics
from txbroker.server.producer import Producer
from txbroker.server.receipts import Receiver
from txbroker.server.replication.epochs import EpochHistory
from txbroker.server.replication.master import ReplicationMaster, ReplicaTracker
from txbroker.server.replication.slave import Replicator, replica_name
from txbroker.server.retry import RetryService
from txbroker.server.role import WRITES, Role
from txbroker.server.tlslisten import TlsListener
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore, StoreConfig
from txbroker.store.snapshot import Snapshot
from txbroker.tx.checker import BackChecker, CheckSettings
from txbroker.tx.coordinator import TxCoordinator, TxSettings
from txbroker.tx.halfcopy import COMPACT_INTERVAL_S, HalfCopier

__all__ = ["BrokerServer", "serve"]

log = logging.getLogger(__name__)

# Connections the kernel queues before the broker accepts them. Python's default of 100 made a
# burst of connects overflow it, and a connect the kernel drops waits out SYN retransmits
# (1 s, then 3 s...): the broker accepts quickly and sheds with admission.py instead. The
# kernel caps it at net.core.somaxconn (4,096 by default since Linux 5.4).
ACCEPT_BACKLOG = 1024

# What a layer above adds to the HTTP app (the console): routes built from the started server.
HttpRoutes: TypeAlias = Callable[["BrokerServer"], Sequence[BaseRoute]]


class BrokerServer:
    def __init__(self, config: ServerConfig, http_routes: HttpRoutes | None = None) -> None:
        self.config = config
        self._http_routes = http_routes
        self.retry: RetryService | None = None
        self.store: MessageStore | None = None
        self.topics = TopicRegistry(config.data_dir / "meta")
        self.groups = GroupCoordinator(
            config.data_dir / "meta", session_timeout_ms=config.session_timeout_ms
        )
        self.consumer: ConsumerService | None = None
        self.receiver: Receiver | None = None  # receiving by receipt (the HTTP API)
        self.scheduler: DelayScheduler | None = None
        self.tx: TxCoordinator | None = None
        self.checker: BackChecker | None = None
        self._notifier: Notifier | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._halves: HalfCopier | None = None
        self._admin: Admin | None = None
        self.metrics: BrokerMetrics | None = None
        self._http: HttpServer | None = None
        self.http_port = 0
        self._server: asyncio.Server | TlsListener | None = None
        self._connections: set[Connection] = set()
        self.admission: Admission | None = None
        self.access: Access | None = None
        self.membership: Membership | None = None  # with a coordinator (broker groups)
        self.port = 0
        # Replication (replication.py): a slave follows replica_of's log and refuses writes.
        self.replication = config.replication_settings()
        self.replicas: ReplicaTracker | None = None  # master: its slaves' flushed offsets
        self.replicator: Replicator | None = None  # slave: the task following the master
        self.failover: Failover | None = None  # --role auto in a group: the role as elected
        self.master_http: str | None = None  # the elected master's HTTP URL, when another's
        self.role = Role()  # what is served now: a slave refuses writes (role.py)
        # The opcode -> handler table every front end calls (docs/server.md).
        self.handlers: dict[int, Handler] = {}
        self.epochs = EpochHistory(config.data_dir / "meta")
        self._master_tls_context: ssl.SSLContext | None = None
        # Set when the broker must restart to apply a tail cut (failover.py); serve() does.
        self.restart = asyncio.Event()
        self.restart_reason = ""

    async def start(self) -> None:
        cfg = self.config
        files = raise_nofile_limit()  # before the store maps its files
        if cfg.tls_ca is not None:
            self._master_tls()  # a CA file that cannot be read stops the start, not a slave later
        self.topics.load()  # first: the store opens with the deleted topics' fences
        self.store = await MessageStore.open(
            StoreConfig(
                cfg.data_dir / "store",
                flush=cfg.flush,
                segment_bytes=cfg.segment_bytes,
                index_capacity=cfg.index_capacity,
                # Slots scale with capacity (about two entries a slot at capacity).
                index_slots=max(cfg.index_capacity // 2, 1),
                truncate_damaged_tail=cfg.repair_truncate,
                retention_ms=cfg.retention_ms or None,
                retention_bytes=cfg.retention_bytes or None,
                retention_check_interval_ms=cfg.retention_check_interval_ms,
            ),
            self.topics.fences,
        )
        # Before retention deletes a segment, open transactions' halves are copied out of it
        # (the mover refuses until the transactions are recovered, so none is lost meanwhile).
        self.store.retention_hook = self._halves = HalfCopier(self.store)
        slave = self.replication.replica_of
        elects = cfg.elects
        # A slave's log is its master's: no write of its own, no copies. An electing broker
        # starts as one, and takes the master's duties if it wins (failover.py).
        passive = slave is not None or elects
        if slave is not None:
            self.store.follow(slave)
            self.store.retention_hook = None
        self.epochs.load()
        self.topics.adopt_fences(self.store.fences.as_dict())  # as recovery left them
        self.groups.load()
        self.groups.prune(self.topics.exists)
        store = self.store
        self.groups.clamp_offsets(lambda t, q: store.queue_range(t, q)[1])
        notifier = self._notifier = Notifier()
        self.scheduler = DelayScheduler(
            self.store, self.topics, cfg.data_dir / "meta", notifier.notify
        )
        self.scheduler.load()
        if not passive:  # a slave's delayed messages are moved by its master
            self.scheduler.start()
        producer = Producer(
            self.store,
            self.topics,
            dedup_window_ms=cfg.dedup_window_ms,
            notifier=notifier,
            scheduler=self.scheduler,
        )
        retry = self.retry = RetryService(
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
            producer,
            cfg.data_dir / "meta",
            TxSettings(
                cfg.tx_timeout_ms,
                secrets=cfg.tx_secrets,
                default_secret=cfg.tx_default_secret,
                stall_after_ms=cfg.stall_after_ms,
            ),
            notifier.notify,
        )
        if not passive:  # transactions are the master's (back-checks, recovery copies)
            await self.tx.recover()
            self._halves.start(self.tx)
        self.checker = BackChecker(
            self.tx,
            CheckSettings(
                cfg.check_backoff_base_ms,
                cfg.check_backoff_cap_ms,
                cfg.max_checks,
                cfg.check_concurrency,
                cfg.check_rate_per_s,
                cfg.check_timeout_ms,
                cfg.check_deadline_ms,
                cfg.check_endpoint_concurrency,
                cfg.check_breaker_failures,
                cfg.check_breaker_base_ms,
                cfg.check_breaker_cap_ms,
            ),
        )
        self.tx.on_prepared = self.checker.schedule
        if not passive:
            self.checker.start()
        admin = self._admin = Admin(self.store, self.topics, self.groups)
        deletion = TopicDeletion(self.store, self.topics, self.groups, notifier, self.tx)
        deletion.forget_fences()
        # Which requests are served now: all on a master; a slave refuses writes (role.py).
        role = self.role
        slaves: ReplicationMaster | None = None  # a broker that may be master serves slaves
        if slave is not None:
            role.refuse(
                WRITES,
                f"this broker is a slave of {slave}: writes and offset commits go to the master",
            )
        else:
            slaves = ReplicationMaster(
                self.store,
                self.topics,
                self.replication,
                epochs=self.epochs if elects else None,
                offsets=self.groups.all_offsets,
                # Held long polls re-read: what the slaves now hold of a timed-out write is
                # readable (a woken poll that finds nothing waits on).
                on_late_cover=notifier.wake_all,
            )
        handlers = self.handlers = build_handlers(
            admin,
            self.topics,
            producer,
            self.consumer,
            retry,
            self.tx,
            deletion,
            slaves,
        )
        if elects:
            assert slaves is not None
            self.failover = self._failover(slaves, notifier, deletion)
            self.failover.start()
        elif slaves is not None:
            self.replicas = slaves.begin()
            slaves.gate()
        tx = self.tx
        access = self.access = Access(
            cfg.token_table(), lambda tx_id: t.topic if (t := tx.find(tx_id)) else None
        )
        self._housekeeping = asyncio.create_task(self._housekeep(), name="txb-groups")
        broker = tcp_requests(handlers, self.role)  # the HTTP API's way into the handlers
        self.receiver = Receiver(broker, self.topics)
        self.receiver.start()

        def hello(_: Hello) -> HelloOk:
            return HelloOk(__version__, PROTOCOL_VERSION, access.tokens.required)

        admission = self.admission = Admission(self._connection_limits(files))
        admission.start()

        def connection() -> Connection:
            return Connection(
                handlers,
                access=access,
                hello=hello,
                connections=self._connections,
                role=role,
                admission=admission,
                http_port=self.http_port,
            )

        tls = self._tls_files()
        if tls is not None:
            limits = admission.limits
            listener = TlsListener(
                connection,
                server_context(tls),
                handshake_timeout_s=limits.handshake_timeout_s,
                pending_max=limits.max_connections - limits.reserved,
            )
            listener.listen(cfg.host, cfg.port, ACCEPT_BACKLOG)
            self._server = listener
        else:
            self._server = await asyncio.get_running_loop().create_server(
                connection, cfg.host, cfg.port, reuse_address=True, backlog=ACCEPT_BACKLOG
            )
        self.port = self._server.sockets[0].getsockname()[1]
        self.metrics = BrokerMetrics(
            self.store,
            self.topics,
            self.groups,
            admin,
            self.tx,
            self.checker,
            admission=admission,
            reconcile_reports=cfg.reconcile_reports,
            forbidden=access.forbidden,
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
        extra = list(self._http_routes(self)) if self._http_routes is not None else []
        app = build_http_app(
            self.store,
            self.topics,
            admin,
            tx=self.tx,
            checker=self.checker,
            metrics=self.metrics,
            connections=admission.info,
            extra_routes=extra,
            broker=broker,
            access=access,
            dedup_window_ms=cfg.dedup_window_ms,
            master_http=lambda: self.master_http,
            receiver=self.receiver,
        )
        self._http = HttpServer(
            app, cfg.host, cfg.http_port, tls=tls, not_http_note=http_port_note(self.port)
        )
        await self._http.start()
        self.http_port = self._http.port
        _warn_if_exposed(cfg, access, self.port, self.http_port)
        if slave is not None:
            self.replicator = Replicator(
                self.store,
                self.topics,
                deletion,
                slave,
                replica_name(cfg.data_dir / "meta"),
                notifier.notify,
                cfg.auth_token,
                on_offsets=self._adopt_offsets,
                tls=self._master_tls,
            )
            self.replicator.start()
        if cfg.coordinator is not None and cfg.group is not None:
            failover = self.failover
            self.membership = Membership(
                MembershipSettings.of(cfg, self.port, self.http_port, tls is not None),
                flushed_offset=lambda: self.store.flushed_offset if self.store else 0,
                log_epoch=lambda: self.epochs.last_epoch,
                on_master=self._on_master if failover is not None else None,
                on_elected=failover.promote if failover is not None else None,
                on_step_down=failover.step_down if failover is not None else None,
            )
            await self.membership.start()
        for route in extra:
            if isinstance(route, Mount) and route.name:
                scheme = "https" if tls is not None else "http"
                log.info(
                    "%s: %s://%s:%d%s", route.name, scheme, cfg.host, self.http_port, route.path
                )

    def _failover(
        self, slaves: ReplicationMaster, notifier: Notifier, deletion: TopicDeletion
    ) -> Failover:
        cfg = self.config
        assert self.store and self.tx and self.checker and self.scheduler and self._halves
        duties = MasterDuties(
            self.store,
            self.tx,
            self.checker,
            self.scheduler,
            self._halves,
            self.role,
            slaves,
            self.epochs,
        )
        store, topics = self.store, self.topics
        name = replica_name(cfg.data_dir / "meta")

        def replicator_for(master: str) -> Replicator:
            return Replicator(
                store,
                topics,
                deletion,
                master,
                name,
                notifier.notify,
                cfg.auth_token,
                epochs=self.epochs,
                on_diverged=failover.diverged,
                on_offsets=self._adopt_offsets,
                tls=self._master_tls,
            )

        failover = Failover(duties, replicator_for, cfg.data_dir, self._request_restart)
        return failover

    def _on_master(self, info: BrokerInfo | None) -> None:
        # Where the HTTP API redirects writes (the failover itself follows the TCP address).
        self.master_http = info.http if info is not None else None
        assert self.failover is not None
        self.failover.on_master(info)

    def _adopt_offsets(self, offsets: dict[str, dict[str, dict[int, int]]]) -> None:
        store = self.store
        assert store is not None
        self.groups.adopt_offsets(
            offsets, self.topics.exists, lambda t, q: store.queue_range(t, q)[1]
        )

    def _request_restart(self, reason: str) -> None:
        log.warning("restart requested: %s", reason)
        self.restart_reason = reason
        self.restart.set()

    @property
    def is_master(self) -> bool:
        """Whether this broker takes writes now (a broker of no group always does)."""
        if self.failover is not None:
            return self.failover.duties.active
        return not self.replication.slave

    def _master_tls(self) -> ssl.SSLContext:
        """The context a slave connects to a ``txbs://`` master with: its certificate checked
        against ``tls_ca`` (else the system's CAs); this broker's own certificate presented to
        a master that asks for one (mutual TLS). Made once, on first use."""
        if self._master_tls_context is None:
            cfg = self.config
            self._master_tls_context = client_context(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
        return self._master_tls_context

    def _tls_files(self) -> TlsFiles | None:
        cfg = self.config
        if cfg.tls_cert is None or cfg.tls_key is None:
            return None
        return TlsFiles(cfg.tls_cert, cfg.tls_key, cfg.tls_client_ca)

    @property
    def admin(self) -> Admin:
        """What operators ask (offsets, groups, rates); set by :meth:`start`."""
        assert self._admin is not None, "the server has not started"
        return self._admin

    def _connection_limits(self, files: FileLimit) -> Limits:
        """The configured connection limits, lowered to what the open-file limit leaves after
        the files open now (the store's) and a margin; logged."""
        cfg = self.config
        assert cfg.reserved_connections is not None  # derived by ServerConfig
        free = files.soft - open_files() - FILES_MARGIN - cfg.check_concurrency
        most, reserved = fit_limits(cfg.max_connections, cfg.reserved_connections, free)
        if most < cfg.max_connections:
            log.warning(
                "connections: max_connections %d lowered to %d (%d reserved): the open-file "
                "limit %d leaves no more; raise the hard limit (ulimit -Hn, LimitNOFILE=)",
                cfg.max_connections,
                most,
                reserved,
                files.soft,
            )
        limits = Limits(
            most,
            reserved,
            cfg.handshake_timeout_ms / 1000,
            cfg.idle_timeout_ms / 1000,
            cfg.max_frames_per_s,
        )
        log.info(
            "connections: at most %d, %d of them reserved for authenticated clients; HELLO "
            "within %d ms; idle ones closed after %s; at most %s frames/s each",
            most,
            reserved,
            cfg.handshake_timeout_ms,
            f"{cfg.idle_timeout_ms} ms" if cfg.idle_timeout_ms else "never",
            cfg.max_frames_per_s or "unlimited",
        )
        return limits

    async def _housekeep(self) -> None:
        """Expire silent group members, sample the rates operators see and persist committed
        offsets, once a second; copy old open half messages forward now and then."""
        ticks = 0
        while True:
            await asyncio.sleep(1)
            ticks += 1
            # A slave copies nothing forward: its master does.
            if self._halves is not None and ticks % COMPACT_INTERVAL_S == 0 and self.is_master:
                try:
                    await self._halves.compact()
                except Exception:  # the next round retries; the log says why
                    log.exception("cannot copy old half messages forward")
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
        if self.replicator is not None:
            await self.replicator.stop()
        if self.membership is not None:
            await self.membership.stop()  # clients move to another broker at once
        if self.failover is not None:
            await self.failover.stop()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            await asyncio.gather(self._housekeeping, return_exceptions=True)
        if self.admission is not None:
            await self.admission.stop()
        if self.receiver is not None:
            await self.receiver.stop()  # held receives answer now: the HTTP server stops sooner
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
        if self.checker is not None and self.is_master:
            await self.checker.stop()
        if self.tx is not None and self.is_master:
            await self.tx.snapshot.save_async()
        if self.scheduler is not None and self.is_master:
            await self.scheduler.stop()
        if self.store is not None:
            await self.store.close()


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _warn_if_exposed(cfg: ServerConfig, access: Access, port: int, http_port: int) -> None:
    """A WARNING at start when the broker listens beyond loopback with no token (anyone who
    reaches the ports may do anything), or with tokens but no TLS (they travel in clear)."""
    if _loopback(cfg.host):
        return
    if not access.tokens.required:
        log.warning(
            "security: listening on %s without any token: whoever reaches ports %d and %d may "
            "produce, consume, delete topics and resolve transactions; set --auth-token or "
            "--token-file (docs/operations.md, 'Security')",
            cfg.host,
            port,
            http_port,
        )
    elif cfg.tls_cert is None:
        log.warning(
            "security: listening on %s without TLS: tokens and messages travel in clear; set "
            "--tls-cert and --tls-key",
            cfg.host,
        )


async def serve(config: ServerConfig, http_routes: HttpRoutes | None = None) -> None:
    server = BrokerServer(config, http_routes)
    await server.start()
    tune_for_serving()  # after start-up and recovery: what is alive now is frozen
    stop = stop_on_signals()
    print(
        f"{READY_PREFIX} tcp={config.host}:{server.port} http={config.host}:{server.http_port} "
        f"data={config.data_dir} "
        f"flush={config.flush.value} build={BUILD.kind}"
        + (" tls=on" if config.tls_cert is not None else ""),
        flush=True,
    )
    restart = asyncio.ensure_future(server.restart.wait())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait((restart, stopping), return_when=asyncio.FIRST_COMPLETED)
    restart.cancel()
    stopping.cancel()
    print("txbroker stopping: answering in-flight requests, flushing the store", file=sys.stderr)
    await server.stop()
    if server.restart.is_set() and not stop.is_set():
        # The same command again, in this process (same pid, same output): the store's open
        # applies the tail cut failover recorded (failover.py).
        print(f"txbroker restarting: {server.restart_reason}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execv(sys.executable, sys.orig_argv)
    print("txbroker stopped", file=sys.stderr, flush=True)
