"""The connection limits' settings: flag, environment and TOML, each validated with an error
that names the setting; and how the open-file limit lowers them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli
from txbroker.cli import build_parser
from txbroker.cli.serve import config_from_args
from txbroker.errors import InvalidArgument
from txbroker.server.admission import fit_limits
from txbroker.server.config import ServerConfig


def test_defaults_and_the_three_sources(tmp_path: Path) -> None:
    d = ServerConfig()
    assert (d.max_connections, d.reserved_connections) == (10_000, 1_000)
    assert (d.handshake_timeout_ms, d.idle_timeout_ms, d.max_frames_per_s) == (
        5_000,
        300_000,
        200_000,
    )
    toml = tmp_path / "broker.toml"
    toml.write_text("max_connections = 500\nidle_timeout_ms = 0\nhandshake_timeout_ms = 2000\n")
    env = {"TXB_MAX_FRAMES_PER_S": "0", "TXB_HANDSHAKE_TIMEOUT_MS": "3000"}
    args = build_parser().parse_args(["serve", "--handshake-timeout-ms", "4000"])
    c = config_from_args(args, env, toml)
    assert c.max_connections == 500 and c.reserved_connections == 50  # a tenth, derived
    assert (c.idle_timeout_ms, c.max_frames_per_s, c.handshake_timeout_ms) == (0, 0, 4000)
    flags = ["serve", "--max-connections", "300", "--reserved-connections", "0"]
    c = config_from_args(build_parser().parse_args(flags), {})
    assert (c.max_connections, c.reserved_connections) == (300, 0)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TXB_MAX_CONNECTIONS": "1"}, "max_connections must be at least 2, got 1"),
        (
            {"TXB_MAX_CONNECTIONS": "10", "TXB_RESERVED_CONNECTIONS": "10"},
            "reserved_connections must be 0..max_connections-1 (9), got 10",
        ),
        ({"TXB_HANDSHAKE_TIMEOUT_MS": "0"}, "handshake_timeout_ms must be positive, got 0"),
        ({"TXB_IDLE_TIMEOUT_MS": "500"}, "idle_timeout_ms must be 0 (never) or at least 1000"),
        ({"TXB_MAX_FRAMES_PER_S": "-1"}, "max_frames_per_s must be 0 (no limit) or positive"),
        ({"TXB_MAX_FRAMES_PER_S": "lots"}, "max_frames_per_s must be an integer, got 'lots'"),
    ],
)
def test_bad_values_are_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        ServerConfig.build({}, env)
    assert message in str(e.value)


def test_the_cli_refuses_bad_values_before_starting(tmp_path: Path) -> None:
    bad_flag = run_cli("serve", "--data-dir", str(tmp_path), "--max-connections", "0")
    assert bad_flag.returncode == 2 and "must be positive, got 0" in bad_flag.stderr
    data = str(tmp_path / "d")
    bad = run_cli(
        "serve", "--data-dir", data, "--max-connections", "8", "--reserved-connections", "8"
    )
    assert bad.returncode != 0
    assert "reserved_connections must be 0..max_connections-1 (7), got 8" in bad.stderr


def test_limits_fit_the_descriptors_left() -> None:
    assert fit_limits(10_000, 1_000, 50_000) == (10_000, 1_000)  # room enough: as configured
    assert fit_limits(10_000, 1_000, 173) == (173, 17)  # the reserve in proportion
    assert fit_limits(10_000, 5, 100) == (100, 1)  # a reserve asked for stays at least one
    assert fit_limits(10_000, 0, 100) == (100, 0)
    assert fit_limits(10_000, 1_000, -40) == (2, 1)  # never below two
