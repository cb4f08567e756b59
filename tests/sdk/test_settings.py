"""A service's settings from the environment, by the CLI's names: what the code passes wins,
then the TXB_* variable, then the default; an empty variable is unset; the TLS variables count
for a txbs:// broker only; TXB_URL, the old name of
TXB_SERVER, is read when TXB_SERVER is not set, with a warning. The shop example, run
against a broker with a token by tests/examples/test_shop.py, shows it end to end."""

from __future__ import annotations

import argparse
import logging

import pytest

from txbroker.cli.common import add_broker_options, add_database_option
from txbroker_sdk import TxbService
from txbroker_sdk import settings as names
from txbroker_sdk.errors import InvalidArgument
from txbroker_sdk.settings import DEFAULT_SERVER, ServiceSettings

NONE = dict.fromkeys(
    ("server", "database", "auth_token", "tls_ca", "tls_cert", "tls_key", "check_secret")
)


def test_the_names_are_the_clis() -> None:
    p = argparse.ArgumentParser()
    add_broker_options(p, json_help="")
    add_database_option(p)
    shown = " ".join(p.format_help().split())  # argparse wraps lines
    for name in (
        names.SERVER,
        names.AUTH_TOKEN,
        names.TLS_CA,
        names.TLS_CLIENT_CERT,
        names.TLS_CLIENT_KEY,
        names.DATABASE_URL,
    ):
        assert name in shown, name


def test_passed_then_environment_then_default() -> None:
    env = {
        "TXB_SERVER": "txb://broker:9876",
        "TXB_AUTH_TOKEN": "from-env",
        "TXB_DATABASE_URL": "sqlite:///env.db",
        "TXB_CHECK_SECRET": "env-secret",
    }
    s = ServiceSettings.resolve(env, **NONE)
    assert (s.server, s.auth_token, s.database, s.check_secret) == (
        "txb://broker:9876",
        "from-env",
        "sqlite:///env.db",
        "env-secret",
    )
    given = ServiceSettings.resolve(env, **{**NONE, "server": "txb://other:1", "auth_token": "x"})
    assert (given.server, given.auth_token) == ("txb://other:1", "x")
    empty = ServiceSettings.resolve({"TXB_SERVER": "", "TXB_AUTH_TOKEN": ""}, **NONE)
    assert (empty.server, empty.auth_token, empty.database) == (DEFAULT_SERVER, None, None)
    assert "from-env" not in repr(s) and "env-secret" not in repr(s)  # secrets stay out of logs


def test_tls_variables_count_for_a_tls_broker_only() -> None:
    env = {"TXB_TLS_CA": "ca.pem", "TXB_TLS_CLIENT_CERT": "c.pem", "TXB_TLS_CLIENT_KEY": "k.pem"}
    plain = ServiceSettings.resolve(env, **NONE)
    assert (plain.tls_ca, plain.tls_cert, plain.tls_key) == (None, None, None)
    tls = ServiceSettings.resolve({**env, "TXB_SERVER": "txbs://broker:9876"}, **NONE)
    assert (tls.tls_ca, tls.tls_cert, tls.tls_key) == ("ca.pem", "c.pem", "k.pem")


def test_the_old_txb_url_is_read_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    s = ServiceSettings.resolve({"TXB_URL": "txb://broker:9876"}, **NONE)
    assert s.server == "txb://broker:9876"
    [record] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "read from TXB_URL, the old name of TXB_SERVER" in record.getMessage()
    caplog.clear()
    s = ServiceSettings.resolve({"TXB_URL": "a", "TXB_SERVER": "txb://b:1"}, **NONE)
    assert s.server == "txb://b:1"
    assert caplog.records == []


def test_the_service_takes_the_environment_once_when_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TXB_SERVER", "txb://broker:9876")
    monkeypatch.setenv("TXB_AUTH_TOKEN", "t0ken")
    monkeypatch.setenv("TXB_DATABASE_URL", "sqlite:///svc.db")
    monkeypatch.setenv("TXB_CHECK_SECRET", "s3cret")
    txb = TxbService(producer_group="orders-svc", public_url="http://orders:8000")
    assert (txb.broker, txb.database) == ("txb://broker:9876", "sqlite:///svc.db")
    assert (txb.settings.auth_token, txb.settings.check_secret) == ("t0ken", "s3cret")
    monkeypatch.setenv("TXB_SERVER", "txb://elsewhere:1")
    assert txb.broker == "txb://broker:9876"  # read once


def test_what_is_missing_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TXB_DATABASE_URL", "TXB_CHECK_SECRET"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(InvalidArgument, match="pass database= or set TXB_DATABASE_URL"):
        TxbService()
    with pytest.raises(InvalidArgument, match="set TXB_CHECK_SECRET"):
        TxbService(database="sqlite://", producer_group="g", public_url="http://x")
