"""Retention's settings: flag, environment and TOML, each validated with an error that names
the setting, and what the broker's store is opened with."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from txbroker.cli import build_parser
from txbroker.cli.serve import config_from_args
from txbroker.errors import InvalidArgument
from txbroker.server.config import ServerConfig

MiB = 1024 * 1024


def test_defaults_and_the_three_sources(tmp_path: Path) -> None:
    d = ServerConfig()
    assert (d.retention_ms, d.retention_bytes, d.retention_check_interval_ms) == (
        72 * 3_600_000,
        0,
        10_000,
    )
    toml = tmp_path / "broker.toml"
    toml.write_text("retention_ms = 3600000\nretention_bytes = 1073741824\n")
    env = {"TXB_RETENTION_BYTES": str(512 * MiB), "TXB_RETENTION_CHECK_INTERVAL_MS": "2000"}
    args = build_parser().parse_args(["serve", "--retention-check-interval-ms", "5000"])
    c = config_from_args(args, env, toml)
    assert (c.retention_ms, c.retention_bytes, c.retention_check_interval_ms) == (
        3_600_000,
        512 * MiB,
        5_000,
    )
    c = config_from_args(build_parser().parse_args(["serve", "--retention-hours", "1.5"]), {})
    assert c.retention_ms == 5_400_000
    c = config_from_args(build_parser().parse_args(["serve", "--retention-ms", "0"]), {})
    assert c.retention_ms == 0  # no age limit
    flags = ["serve", "--retention-bytes", str(256 * MiB), "--retention-hours", "0"]
    c = config_from_args(build_parser().parse_args(flags), {"TXB_RETENTION_MS": "5"})
    assert (c.retention_ms, c.retention_bytes) == (0, 256 * MiB)  # flags win


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"TXB_RETENTION_MS": "-1"},
            "retention_ms must be positive (or 0: keep segments whatever their age), got -1",
        ),
        ({"TXB_RETENTION_MS": "3d"}, "retention_ms must be an integer, got '3d'"),
        (
            {"TXB_RETENTION_BYTES": "1000"},
            "retention_bytes must be 0 (no size limit) or at least one segment "
            f"(segment_bytes = {256 * MiB}), got 1000",
        ),
        (
            {"TXB_RETENTION_BYTES": str(8 * MiB), "TXB_SEGMENT_BYTES": str(16 * MiB)},
            f"(segment_bytes = {16 * MiB}), got {8 * MiB}",
        ),
        (
            {"TXB_RETENTION_CHECK_INTERVAL_MS": "100"},
            "retention_check_interval_ms must be at least 1000, got 100",
        ),
    ],
)
def test_bad_values_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ServerConfig.build({}, env)
    assert message in str(e.value)


def test_the_cli_refuses_bad_values_before_starting(tmp_path: Path) -> None:
    both = run_cli("serve", "--retention-hours", "1", "--retention-ms", "1000")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    negative = run_cli("serve", "--retention-hours", "-2")
    assert negative.returncode == 2 and "must be >= 0, got -2" in negative.stderr
    data = str(tmp_path / "d")
    small = run_cli("serve", "--data-dir", data, "--segment-mib", "8", "--retention-bytes", "1")
    assert small.returncode != 0
    assert "retention_bytes must be 0 (no size limit) or at least one segment " in small.stderr
    toml = tmp_path / "bad.toml"
    toml.write_text("retention_check_interval_ms = 10\n")
    bad = run_cli("serve", "--data-dir", data, "--config", str(toml))
    assert bad.returncode != 0
    assert "retention_check_interval_ms must be at least 1000, got 10" in bad.stderr
