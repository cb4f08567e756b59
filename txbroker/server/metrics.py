"""The broker's metrics, through OpenTelemetry, exported for Prometheus at ``/metrics``.

Almost every instrument is *observable*: its callback reads counters the broker keeps anyway
when a scrape collects, so the produce and consume paths do no metric work at all; the two
histograms (fsync and check latencies) are fed off the hot path too. Names follow the
OpenTelemetry messaging conventions where one exists, else ``txbroker.*``; docs/operations.md
lists every one. Without the ``otel`` extra the instruments are the API's no-ops and
``/metrics`` answers 503 naming the extra to install.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from txbroker import __version__
from txbroker.runtime.build import BUILD
from txbroker.server.admin import Admin
from txbroker.server.admission import Admission
from txbroker.server.groups import GroupCoordinator
from txbroker.server.reconciliation import ReconcileSummary, latest_summary
from txbroker.server.topics import TopicRegistry
from txbroker.store import MessageStore
from txbroker.tx.checker import BackChecker
from txbroker.tx.coordinator import OpenCounts, TxCoordinator

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["BrokerMetrics", "CONTENT_TYPE"]

SYSTEM = "txbroker"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds; fsyncs of a healthy disk take 0.1-10 ms, a check-back one HTTP round trip.
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# One scrape calls the three reconciliation callbacks in turn: they share one read of the file.
SUMMARY_TTL_S = 1.0
CHECK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _gauge(value: Callable[[], int | float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value())]

    return callback


class BrokerMetrics:
    """The instruments of one broker, on their own meter provider and Prometheus registry (two
    brokers in one process, as in tests, keep their numbers apart)."""

    def __init__(
        self,
        store: MessageStore,
        topics: TopicRegistry,
        groups: GroupCoordinator,
        admin: Admin,
        tx: TxCoordinator,
        checker: BackChecker,
        gauges: dict[str, tuple[str, Callable[[], int]]] | None = None,
        admission: Admission | None = None,
        reconcile_reports: Path | None = None,
        forbidden: Mapping[str, int] | None = None,
    ) -> None:
        self._store, self._topics, self._groups, self._admin = store, topics, groups, admin
        self._admission = admission
        self._forbidden = forbidden
        self._reports = reconcile_reports
        self._summary_read: tuple[float, ReconcileSummary | None] | None = None
        self._tx, self._checker = tx, checker
        # The three open-transaction gauges of a scrape, counted in one pass (exposition).
        self._open = OpenCounts(0, 0, 0)
        self._fsyncs_seen = 0
        self.registry: CollectorRegistry | None = None
        meter = self._meter()
        self._instruments(meter, gauges or {})

    def _meter(self) -> Meter:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.resources import Resource
            from prometheus_client import CollectorRegistry
        except ImportError:
            from opentelemetry.metrics import get_meter

            return get_meter("txbroker.broker")
        self.registry = CollectorRegistry(auto_describe=True)
        reader = PrometheusMetricReader(registry=self.registry)
        # Labels of target_info on /metrics: which build serves (pure Python or compiled).
        resource = Resource.create(
            {
                "service.name": "txbroker-broker",
                "service.version": __version__,
                "txbroker.build": BUILD.kind,
            }
        )
        self._provider = MeterProvider(metric_readers=[reader], resource=resource)
        return self._provider.get_meter("txbroker.broker")

    def _instruments(self, m: Meter, gauges: dict[str, tuple[str, Callable[[], int]]]) -> None:
        m.create_observable_counter(
            "messaging.client.sent.messages",
            [self._sent],
            unit="{message}",
            description="Messages stored in each topic (committed transactional ones included).",
        )
        m.create_observable_counter(
            "messaging.client.consumed.messages",
            [self._consumed],
            unit="{message}",
            description="Messages each consumer group has committed, per topic.",
        )
        m.create_observable_gauge(
            "txbroker.consumer.lag",
            [self._lag],
            unit="{message}",
            description="Messages past a group's committed offset, per queue.",
        )
        m.create_observable_gauge(
            "txbroker.tx.pending",
            [_gauge(lambda: self._open.pending)],
            unit="{transaction}",
            description="Half messages waiting for their commit or rollback.",
        )
        m.create_observable_gauge(
            "txbroker.tx.parked",
            [_gauge(lambda: self._open.parked)],
            unit="{transaction}",
            description="Transactions the back-checks gave up on; an operator resolves them.",
        )
        m.create_observable_gauge(
            "txbroker.tx.stalled",
            [_gauge(lambda: self._open.stalled)],
            unit="{transaction}",
            description="Pending transactions whose back-checks have reached no one for the "
            "stall time (endpoint unreachable, or no poller): still checked, never decided.",
        )
        m.create_observable_counter(
            "txbroker.tx.prepared",
            [_gauge(lambda: self._tx.counters["prepared"])],
            unit="{transaction}",
            description="Half messages prepared.",
        )
        m.create_observable_counter(
            "txbroker.tx.ended",
            [self._ended],
            unit="{transaction}",
            description="Transactions ended, by decision (commit or rollback).",
        )
        m.create_observable_counter(
            "txbroker.tx.checks",
            [self._checks],
            unit="{check}",
            description="Back-checks made, by outcome (the answer, or why there was none).",
        )
        m.create_observable_gauge(
            "txbroker.tx.checks.inflight",
            [_gauge(lambda: self._checker.inflight)],
            unit="{check}",
            description="Back-checks waiting for their answer now.",
        )
        m.create_observable_gauge(
            "txbroker.tx.checks.pull.queued",
            [_gauge(lambda: self._checker.pull_queued)],
            unit="{check}",
            description="Back-checks by pull that are due and wait for a poller of their group.",
        )
        m.create_observable_gauge(
            "txbroker.tx.check.endpoints.open",
            [_gauge(lambda: self._checker.open_endpoints)],
            unit="{endpoint}",
            description="Check-back endpoints whose circuit breaker is open or half open.",
        )
        m.create_observable_gauge(
            "txbroker.store.size",
            [_gauge(lambda: self._store.write_offset)],
            unit="By",
            description="Bytes appended to the commit log.",
        )
        m.create_observable_gauge(
            "txbroker.store.flushed",
            [_gauge(lambda: self._store.flushed_offset)],
            unit="By",
            description="Bytes of the commit log an fdatasync made durable.",
        )
        m.create_observable_counter(
            "txbroker.store.fsyncs",
            [_gauge(lambda: self._store.committer.fsync_count)],
            unit="{fsync}",
            description="fdatasyncs of the commit log (each covers a group of records).",
        )
        if self._admission is not None:
            m.create_observable_gauge(
                "txbroker.connections.open",
                [self._connections_open],
                unit="{connection}",
                description="Client connections open, by state (handshake: no HELLO yet).",
            )
            m.create_observable_counter(
                "txbroker.connections.refused",
                [self._connections_refused],
                unit="{connection}",
                description="Connections the broker refused or closed by a limit, by reason.",
            )
        if self._forbidden is not None:
            m.create_observable_counter(
                "txbroker.requests.forbidden",
                [self._requests_forbidden],
                unit="{request}",
                description="Requests refused FORBIDDEN: the token lacked the role, by opcode.",
            )
        if self._reports is not None:
            self._reconcile_instruments(m)
        for name, (description, value) in gauges.items():
            m.create_observable_gauge(name, [_gauge(value)], unit="1", description=description)
        self._fsync = m.create_histogram(
            "txbroker.store.fsync.duration",
            unit="s",
            description="Group commit: from a group's request to its fdatasync's end.",
            explicit_bucket_boundaries_advisory=FSYNC_BUCKETS,
        )
        self._check = m.create_histogram(
            "txbroker.tx.check.duration",
            unit="s",
            description="Back-check latency, by outcome.",
            explicit_bucket_boundaries_advisory=CHECK_BUCKETS,
        )
        self._checker.on_checked = self._checked

    def _reconcile_instruments(self, m: Meter) -> None:
        # Read from the newest summary.json when a scrape collects (once for the three, see
        # _summary). No summary yet, or one that cannot be read: no observations.
        m.create_observable_gauge(
            "txbroker.reconcile.anomalies",
            [self._reconcile_anomalies],
            unit="{anomaly}",
            description="Anomalies the latest reconciliation found, by reason (0 when clean).",
        )
        m.create_observable_gauge(
            "txbroker.reconcile.clean",
            [self._reconcile_clean],
            unit="1",
            description="1 when the latest reconciliation found nothing wrong, else 0.",
        )
        m.create_observable_gauge(
            "txbroker.reconcile.as_of",
            [self._reconcile_as_of],
            unit="s",
            description="Unix time the latest reconciliation checked the data up to.",
        )

    def _summary(self) -> ReconcileSummary | None:
        assert self._reports is not None  # the instruments exist only with a folder
        now = time.monotonic()
        if self._summary_read is None or now - self._summary_read[0] > SUMMARY_TTL_S:
            found = latest_summary(self._reports)
            if found is not None and found.problem is not None:
                found = None
            self._summary_read = (now, found)
        return self._summary_read[1]

    def _reconcile_anomalies(self, _: CallbackOptions) -> Iterable[Observation]:
        s = self._summary()
        if s is not None:
            for reason, n in sorted(s.anomalies.items()):
                yield Observation(n, {"txbroker.reconcile.reason": reason})

    def _reconcile_clean(self, _: CallbackOptions) -> Iterable[Observation]:
        s = self._summary()
        if s is not None and s.clean is not None:
            yield Observation(int(s.clean))

    def _reconcile_as_of(self, _: CallbackOptions) -> Iterable[Observation]:
        s = self._summary()
        if s is not None and s.as_of_ms is not None:
            yield Observation(s.as_of_ms / 1000)

    def _checked(self, outcome: str, seconds: float) -> None:
        self._check.record(seconds, {"txbroker.check.outcome": outcome})

    def drain_fsyncs(self) -> None:
        """Record the fsyncs measured since the last call (a scrape, or the once-a-second
        housekeeping) into the histogram: the group commit only appends to a list."""
        seen = self._store.committer.fsync_seconds
        for s in seen[self._fsyncs_seen :]:
            self._fsync.record(s)
        self._fsyncs_seen = len(seen)

    def exposition(self) -> bytes | None:
        """The Prometheus text of every instrument; None without the otel extra."""
        if self.registry is None:
            return None
        from prometheus_client import generate_latest

        self.drain_fsyncs()
        self._open = self._tx.counts()
        return generate_latest(self.registry)

    def shutdown(self) -> None:
        provider = getattr(self, "_provider", None)
        if provider is not None:
            provider.shutdown()

    # Callbacks: each reads what the broker already counts, at collection time.

    def _sent(self, _: CallbackOptions) -> Iterable[Observation]:
        for t in self._topics.list():
            end = sum(o.max_offset for o in self._admin.offsets(t))
            yield Observation(
                end, {"messaging.system": SYSTEM, "messaging.destination.name": t.name}
            )

    def _consumed(self, _: CallbackOptions) -> Iterable[Observation]:
        for g in self._admin.groups():
            yield Observation(
                sum(q.committed or 0 for q in g.queues),
                {
                    "messaging.system": SYSTEM,
                    "messaging.destination.name": g.topic,
                    "messaging.consumer.group.name": g.group,
                },
            )

    def _lag(self, _: CallbackOptions) -> Iterable[Observation]:
        for g in self._admin.groups():
            for q in g.queues:
                yield Observation(
                    q.lag,
                    {
                        "messaging.destination.name": g.topic,
                        "messaging.consumer.group.name": g.group,
                        "messaging.destination.partition.id": str(q.queue),
                    },
                )

    def _ended(self, _: CallbackOptions) -> Iterable[Observation]:
        c = self._tx.counters
        yield Observation(c["committed"], {"txbroker.tx.decision": "commit"})
        yield Observation(c["rolled_back"], {"txbroker.tx.decision": "rollback"})

    def _connections_open(self, _: CallbackOptions) -> Iterable[Observation]:
        a = self._admission
        assert a is not None  # registered only with one
        yield Observation(a.handshaking, {"txbroker.connection.state": "handshake"})
        yield Observation(a.authenticated, {"txbroker.connection.state": "authenticated"})

    def _connections_refused(self, _: CallbackOptions) -> Iterable[Observation]:
        assert self._admission is not None  # registered only with one
        for reason, n in sorted(self._admission.refused.items()):
            yield Observation(n, {"txbroker.connection.reason": reason})

    def _requests_forbidden(self, _: CallbackOptions) -> Iterable[Observation]:
        assert self._forbidden is not None  # registered only with it
        for opcode, n in sorted(self._forbidden.items()):
            yield Observation(n, {"txbroker.opcode": opcode})

    def _checks(self, _: CallbackOptions) -> Iterable[Observation]:
        for outcome, n in sorted(self._checker.outcomes.items()):
            yield Observation(n, {"txbroker.check.outcome": outcome})
