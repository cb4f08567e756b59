"""txbroker_sdk's curated surface: every name in ``__all__`` is there, the database side stays
unimported until asked for, and the errors a service catches all descend from TxbError."""

from __future__ import annotations

import subprocess
import sys

import txbroker_sdk
from tests.conftest import ROOT
from txbroker.errors import TxbError


def test_every_public_name_resolves() -> None:
    missing = [name for name in txbroker_sdk.__all__ if getattr(txbroker_sdk, name, None) is None]
    assert missing == []
    assert len(set(txbroker_sdk.__all__)) == len(txbroker_sdk.__all__)


def test_the_first_hour_errors_are_public_and_typed() -> None:
    from txbroker_sdk import BrokerUnreachable, ConnectionClosed, TablesMissing

    assert issubclass(BrokerUnreachable, ConnectionClosed) and BrokerUnreachable.retriable
    assert issubclass(TablesMissing, TxbError) and not TablesMissing.retriable
    assert txbroker_sdk.require_tables.__module__ == "txbroker_sdk.preflight"


def test_sending_needs_no_sqlalchemy() -> None:
    code = (
        "import sys, txbroker_sdk\n"
        "from txbroker_sdk import Client, Consumer, TablesMissing, BrokerUnreachable\n"
        "assert 'sqlalchemy' not in sys.modules, 'sqlalchemy imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
