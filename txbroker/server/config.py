"""Server settings: one frozen object built once at startup from flags, a TOML config file and
``TXB_*`` environment variables (flags win over the environment, which wins over the file)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from txbroker.cluster.url import parse_coordinator_url
from txbroker.errors import InvalidArgument
from txbroker.server.admission import (
    HANDSHAKE_TIMEOUT_MS,
    IDLE_TIMEOUT_MS,
    MAX_CONNECTIONS,
    MAX_FRAMES_PER_S,
    checked_limits,
)
from txbroker.server.producer import DEFAULT_DEDUP_WINDOW_MS
from txbroker.server.replication import ReplicationSettings
from txbroker.server.retry import DEFAULT_RETRY_DELAYS_MS
from txbroker.server.tokens import TokenEntry, TokenTable, parse_tokens
from txbroker.store import FlushMode

__all__ = ["ServerConfig"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    data_dir: Path = Path("txbroker-data")
    host: str = "127.0.0.1"
    port: int = 9876
    http_port: int = 9877
    flush: FlushMode = FlushMode.SYNC
    auth_token: str | None = field(default=None, repr=False)
    # Access control (tokens.py, access.py): the [[tokens]] of the TOML file and of
    # tokens_file (--token-file, TXB_TOKENS_FILE), each with a name, roles and topic patterns.
    tokens: tuple[TokenEntry, ...] = field(default=(), repr=False)
    tokens_file: Path | None = None
    # TLS on the TCP and HTTP listeners (tls.py): a PEM certificate chain and its key; with a
    # client CA, clients must present a certificate it signed (mutual TLS). The CA is the one
    # that signed the other brokers' certificates: a slave checks its master's against it
    # (default: the system's CAs), and presents its own certificate to a master that asks.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    tls_ca: Path | None = None
    dedup_window_ms: int = DEFAULT_DEDUP_WINDOW_MS
    # Consumer retries: delays between attempts and how many before the dead-letter topic.
    retry_delays_ms: tuple[int, ...] = DEFAULT_RETRY_DELAYS_MS
    max_reconsume: int = 16
    # A consumer that has not heartbeated for this long loses its queues.
    session_timeout_ms: int = 10_000
    # Transactions: first back-check after tx_timeout_ms, then backoff doubling from the base
    # to the cap; park after max_checks checks that reached the endpoint. Checks in flight and
    # the per-endpoint rate are bounded. tx_secrets maps producer group -> HMAC secret
    # (tx_default_secret for other groups).
    tx_timeout_ms: int = 6_000
    check_backoff_base_ms: int = 5_000
    check_backoff_cap_ms: int = 300_000
    max_checks: int = 15
    check_concurrency: int = 64
    check_rate_per_s: float = 100.0
    check_timeout_ms: int = 3_000
    # Fairness between services (txbroker/tx/checklanes.py): a whole check's deadline, checks in
    # flight per endpoint, and the endpoint's circuit breaker (open after this many timeouts or
    # connection failures in a row, for a cool-down doubling from the base to the cap).
    check_deadline_ms: int = 10_000
    check_endpoint_concurrency: int = 8
    check_breaker_failures: int = 5
    check_breaker_base_ms: int = 5_000
    check_breaker_cap_ms: int = 300_000
    # A prepared transaction whose back-checks have reached no one (unreachable endpoint, no
    # poller) for this long is stalled: listed and alerted on, never decided (TxSettings).
    stall_after_ms: int = 900_000
    tx_secrets: dict[str, str] = field(default_factory=dict, repr=False)
    tx_default_secret: str | None = field(default=None, repr=False)
    # Store file sizes (see StoreConfig): commit-log segments and key-index entries per file.
    segment_bytes: int = 256 * 1024 * 1024
    index_capacity: int = 2 << 20
    # Let recovery drop everything from a damaged record on (see StoreConfig); off by default.
    repair_truncate: bool = False
    # Retention (docs/operations.md "Retention"): whole commit-log segments are deleted once
    # their newest record is older than retention_ms (0: never by age; 72 h, as RocketMQ's
    # fileReservedTime) or while the log is larger than retention_bytes (0: no size limit),
    # looked at every retention_check_interval_ms. Open and parked transactions' half
    # messages are copied forward first, so they outlive any retention.
    retention_ms: int = 72 * 3600 * 1000
    retention_bytes: int = 0
    retention_check_interval_ms: int = 10_000
    # Graceful shutdown waits this long for in-flight requests before closing connections.
    shutdown_grace_ms: int = 10_000
    # Connection limits (admission.py, docs/operations.md "Connection limits"). At most
    # max_connections (lowered at start to what the open-file limit allows); connections that
    # have not completed HELLO may hold all but reserved_connections of them (default: a tenth).
    max_connections: int = MAX_CONNECTIONS
    reserved_connections: int | None = None
    # A connection must complete HELLO this soon after it is accepted.
    handshake_timeout_ms: int = HANDSHAKE_TIMEOUT_MS
    # An authenticated connection with no request in flight that sends nothing for this long is
    # closed (0: never). The SDK pings after 60 s of silence, well within it.
    idle_timeout_ms: int = IDLE_TIMEOUT_MS
    # Frames one connection may send per second, in bursts of up to twice as many (0: no limit).
    # 200,000 is about three times what one connection reached in `txbroker bench produce`
    # (70,000 single sends a second on a 2-core machine): a guard against a runaway client.
    max_frames_per_s: int = MAX_FRAMES_PER_S
    # The console's links: a trace UI's URL with {trace_id} in it (Jaeger's
    # http://jaeger:16686/trace/{trace_id}), and the folder the reconciliation writes its
    # summary.json to (its --out, or a parent of dated --out folders).
    trace_url: str | None = None
    reconcile_reports: Path | None = None
    # Broker groups (docs/cluster.md): with a coordinator (etcd://host:port[,...]) the broker
    # registers in etcd as broker_id (default: host-port) of group, master or slave by role
    # (auto: elected). Without one, nothing of this applies.
    coordinator: str | None = None
    group: str | None = None
    broker_id: str | None = None
    role: str = "auto"
    # Replication (read together as ReplicationSettings, replication.py):
    # the master this broker follows as a slave; what a master's writes wait for (sync:
    # min_insync slaves flushed them, at most replication_timeout_ms; async: its own flush).
    replica_of: str | None = None
    replication: str = "async"
    min_insync: int = 1
    replication_timeout_ms: int = 5_000

    @classmethod
    def build(
        cls,
        flags: Mapping[str, Any],
        env: Mapping[str, str],
        config_file: Path | None = None,
    ) -> ServerConfig:
        values: dict[str, Any] = {}
        names = {f.name for f in fields(cls)}
        if config_file is not None:
            try:
                data = tomllib.loads(config_file.read_text())
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise InvalidArgument(f"cannot read config file {config_file}: {e}") from e
            unknown = set(data) - names
            if unknown:
                raise InvalidArgument(f"unknown settings in {config_file}: {sorted(unknown)}")
            values.update(data)
        for name in names:
            key = "TXB_" + name.upper()
            if key in env:
                values[name] = env[key]
        values.update({k: v for k, v in flags.items() if v is not None and k in names})
        values["tokens"] = _tokens(values, config_file)
        return cls(**_coerce(values))

    def token_table(self) -> TokenTable:
        """The broker's tokens: ``auth_token`` (an admin token) and the ``[[tokens]]``."""
        return TokenTable.build(self.auth_token, self.tokens)

    def __post_init__(self) -> None:
        for name in (
            "tx_timeout_ms",
            "check_backoff_base_ms",
            "check_backoff_cap_ms",
            "check_timeout_ms",
            "check_deadline_ms",
            "check_endpoint_concurrency",
            "check_breaker_failures",
            "check_breaker_base_ms",
            "check_breaker_cap_ms",
            "stall_after_ms",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if self.check_breaker_base_ms > self.check_breaker_cap_ms:
            raise InvalidArgument("check_breaker_base_ms must not exceed check_breaker_cap_ms")
        if self.max_checks < 1 or self.check_concurrency < 1 or self.check_rate_per_s <= 0:
            raise InvalidArgument("max_checks, check_concurrency and check_rate_per_s must be > 0")
        if self.auth_token == "":
            raise InvalidArgument("auth_token must not be empty (omit it to run without auth)")
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise InvalidArgument(f"{name} must be 0..65535")
        if self.dedup_window_ms <= 0:
            raise InvalidArgument("dedup_window_ms must be positive")
        self._check_retention()
        self.token_table()  # names and tokens unique
        if (self.tls_cert is None) != (self.tls_key is None):
            raise InvalidArgument("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise InvalidArgument("tls_client_ca needs tls_cert and tls_key (TLS itself)")
        self._check_connection_limits()
        _check_cluster(self)
        self.replication_settings()  # raises InvalidArgument on a bad value

    @property
    def elects(self) -> bool:
        """Whether this broker's role follows its group's election (``--role auto`` in a
        group): it starts as a slave and may become master (failover.py)."""
        return self.coordinator is not None and self.group is not None and self.role == "auto"

    def replication_settings(self) -> ReplicationSettings:
        """The replication settings, read as one (``txbroker.server.replication``)."""
        return ReplicationSettings(
            self.replica_of, self.replication, self.min_insync, self.replication_timeout_ms
        )

    def _check_retention(self) -> None:
        if self.retention_ms < 0:
            raise InvalidArgument(
                f"retention_ms must be positive (or 0: keep segments whatever their age), got "
                f"{self.retention_ms}"
            )
        if self.retention_bytes != 0 and self.retention_bytes < self.segment_bytes:
            raise InvalidArgument(
                f"retention_bytes must be 0 (no size limit) or at least one segment "
                f"(segment_bytes = {self.segment_bytes}), got {self.retention_bytes}"
            )
        if self.retention_check_interval_ms < 1_000:
            # Retention runs after a checkpoint, once a second: a shorter interval is not kept.
            raise InvalidArgument(
                "retention_check_interval_ms must be at least 1000, got "
                f"{self.retention_check_interval_ms}"
            )

    def _check_connection_limits(self) -> None:
        limits = checked_limits(
            self.max_connections,
            self.reserved_connections,
            self.handshake_timeout_ms,
            self.idle_timeout_ms,
            self.max_frames_per_s,
        )
        # frozen: the default reserve is derived once, here
        object.__setattr__(self, "reserved_connections", limits.reserved)
        if self.trace_url is not None and (
            not self.trace_url.startswith(("http://", "https://"))
            or "{trace_id}" not in self.trace_url
        ):
            raise InvalidArgument(
                "trace_url must be an http(s) URL with {trace_id} in it, "
                f"e.g. http://jaeger:16686/trace/{{trace_id}}; got {self.trace_url!r}"
            )


def _check_cluster(cfg: ServerConfig) -> None:
    if (cfg.coordinator is None) != (cfg.group is None):
        raise InvalidArgument("coordinator and group go together: give both or neither")
    if cfg.role not in ("auto", "master", "slave"):
        raise InvalidArgument(f"role must be auto, master or slave, got {cfg.role!r}")
    if cfg.coordinator is not None:
        parse_coordinator_url(cfg.coordinator)  # a typo stops the start
        if cfg.role == "auto" and cfg.replica_of is not None:
            raise InvalidArgument(
                "with --role auto a broker follows its group's elected master; give "
                "--replica-of only with --role slave"
            )


def _coerce(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    try:
        for name in (
            "port",
            "http_port",
            "dedup_window_ms",
            "shutdown_grace_ms",
            "session_timeout_ms",
            "max_reconsume",
            "segment_bytes",
            "index_capacity",
            "tx_timeout_ms",
            "check_backoff_base_ms",
            "check_backoff_cap_ms",
            "max_checks",
            "check_concurrency",
            "check_timeout_ms",
            "check_deadline_ms",
            "check_endpoint_concurrency",
            "check_breaker_failures",
            "check_breaker_base_ms",
            "check_breaker_cap_ms",
            "stall_after_ms",
            "max_connections",
            "reserved_connections",
            "handshake_timeout_ms",
            "idle_timeout_ms",
            "max_frames_per_s",
            "retention_ms",
            "retention_bytes",
            "retention_check_interval_ms",
            "min_insync",
            "replication_timeout_ms",
        ):
            if name in out and out[name] is not None:
                try:
                    out[name] = int(out[name])
                except ValueError:
                    raise InvalidArgument(f"{name} must be an integer, got {out[name]!r}") from None
        for name in (
            "data_dir",
            "reconcile_reports",
            "tokens_file",
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "tls_ca",
        ):
            if out.get(name) is not None:
                out[name] = Path(out[name])
        if "check_rate_per_s" in out:
            out["check_rate_per_s"] = float(out["check_rate_per_s"])
        if isinstance(out.get("tx_secrets"), str):  # TXB_TX_SECRETS="group=secret,other=s2"
            out["tx_secrets"] = _pairs(out["tx_secrets"].split(","))
        if isinstance(out.get("tx_secrets"), list):  # repeated --tx-secret GROUP=SECRET
            out["tx_secrets"] = _pairs(out["tx_secrets"])
        if isinstance(out.get("repair_truncate"), str):
            out["repair_truncate"] = out["repair_truncate"].strip().lower() in ("1", "true", "yes")
        if "retry_delays_ms" in out:
            raw = out["retry_delays_ms"]
            items = raw.split(",") if isinstance(raw, str) else raw
            out["retry_delays_ms"] = tuple(int(x) for x in items)
        if "flush" in out:
            out["flush"] = FlushMode(out["flush"])
    except ValueError as e:
        raise InvalidArgument(f"bad setting: {e}") from e
    return out


def _tokens(values: dict[str, Any], config_file: Path | None) -> tuple[TokenEntry, ...]:
    """The ``[[tokens]]`` of the config file and of ``tokens_file``, parsed (never quoted in an
    error: a message names the token's entry, not its value)."""
    raw = values.pop("tokens", None)
    if isinstance(raw, str):
        raise InvalidArgument(
            "tokens are set as [[tokens]] in the TOML file or in --token-file (TXB_TOKENS_FILE)"
        )
    entries = parse_tokens(raw, str(config_file)) if raw is not None else []
    path = values.get("tokens_file")
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidArgument(f"cannot read the token file {path}: {e}") from e
        if set(data) - {"tokens"}:
            raise InvalidArgument(f"the token file {path} holds only [[tokens]] entries")
        entries += parse_tokens(data.get("tokens", []), str(path))
    return tuple(entries)


def _pairs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        group, sep, secret = item.strip().partition("=")
        if not sep or not group or not secret:
            raise InvalidArgument(f"expected GROUP=SECRET, got {item!r}")
        out[group] = secret
    return out
