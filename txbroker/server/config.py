"""Server settings: one frozen object built once at startup from flags, a TOML config file and
``TXB_*`` environment variables (flags win over the environment, which wins over the file)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from txbroker.errors import InvalidArgument
from txbroker.server.producer import DEFAULT_DEDUP_WINDOW_MS
from txbroker.server.retry import DEFAULT_RETRY_DELAYS_MS
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
    tx_secrets: dict[str, str] = field(default_factory=dict, repr=False)
    tx_default_secret: str | None = field(default=None, repr=False)
    # Store file sizes (see StoreConfig): commit-log segments and key-index entries per file.
    segment_bytes: int = 256 * 1024 * 1024
    index_capacity: int = 2 << 20
    # Let recovery drop everything from a damaged record on (see StoreConfig); off by default.
    repair_truncate: bool = False
    # Graceful shutdown waits this long for in-flight requests before closing connections.
    shutdown_grace_ms: int = 10_000

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
        return cls(**_coerce(values))

    def __post_init__(self) -> None:
        for name in (
            "tx_timeout_ms",
            "check_backoff_base_ms",
            "check_backoff_cap_ms",
            "check_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise InvalidArgument(f"{name} must be positive")
        if self.max_checks < 1 or self.check_concurrency < 1 or self.check_rate_per_s <= 0:
            raise InvalidArgument("max_checks, check_concurrency and check_rate_per_s must be > 0")
        if self.auth_token == "":
            raise InvalidArgument("auth_token must not be empty (omit it to run without auth)")
        for name in ("port", "http_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise InvalidArgument(f"{name} must be 0..65535")
        if self.dedup_window_ms <= 0:
            raise InvalidArgument("dedup_window_ms must be positive")


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
        ):
            if name in out:
                out[name] = int(out[name])
        if "data_dir" in out:
            out["data_dir"] = Path(out["data_dir"])
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


def _pairs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        group, sep, secret = item.strip().partition("=")
        if not sep or not group or not secret:
            raise InvalidArgument(f"expected GROUP=SECRET, got {item!r}")
        out[group] = secret
    return out
